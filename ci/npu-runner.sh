#!/usr/bin/env bash
# The self-hosted NPU job of ci/github/trainbox-smoke.yml and ci/gitlab/trainbox-smoke.gitlab-ci.yml: on a host
# with Ascend cards, build the stack's image on its real CANN base, run `trainbox doctor --strict` in it with the
# cards and driver mounted, then run the 8-card Megatron smoke recipe on the real cards.
#
# Environment:
#   MODELSCOPE_CACHE  ModelScope cache the cookbook script downloads Qwen/Qwen3-4B and its data into (kept
#                 between runs: fill it once where ModelScope is reachable)                required
#   TWINKLE_DIR   a Twinkle checkout to run instead of the image's tree (2f01c452)         optional
#   STACK         stack to build (default twinkle: the recipe's)
#   RECIPE        recipe to run (default twinkle-megatron-tp-8npu: TP2 x PP2 x DP2 on 8 cards)
#   CARDS         how many cards, /dev/davinci0 .. CARDS-1 (default 8)
#   PYTHON        the Python that has trainbox installed (default python3)
set -euo pipefail
cd "$(dirname "$0")/.."

STACK="${STACK:-twinkle}"
RECIPE="${RECIPE:-twinkle-megatron-tp-8npu}"
CARDS="${CARDS:-8}"
PYTHON="${PYTHON:-python3}"
: "${MODELSCOPE_CACHE:?set MODELSCOPE_CACHE to the ModelScope cache holding the model and data of the smoke}"
trainbox() { "$PYTHON" -m trainbox.cli "$@"; }

mkdir -p build/reports
report="build/reports/npu-runner-${STACK}.json"
echo "npu-runner: building ${STACK} on its own base"
trainbox image build "$STACK" -o "$report"
image="$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["tag"])' "$report")"

# The devices and read-only driver mounts an NPU container needs (what `trainbox run` gives a job).
last=$((CARDS - 1))
visible="$(seq -s, 0 "$last")"
npu=(--device /dev/davinci_manager --device /dev/devmm_svm --device /dev/hisi_hdc
     -v /usr/local/dcmi:/usr/local/dcmi:ro
     -v /usr/local/bin/npu-smi:/usr/local/bin/npu-smi:ro
     -v /usr/local/Ascend/driver/lib64:/usr/local/Ascend/driver/lib64:ro
     -v /usr/local/Ascend/driver/version.info:/usr/local/Ascend/driver/version.info:ro
     -v /etc/ascend_install.info:/etc/ascend_install.info:ro
     -e "ASCEND_RT_VISIBLE_DEVICES=${visible}")
for i in $(seq 0 "$last"); do
    npu+=(--device "/dev/davinci${i}")
done

echo "npu-runner: trainbox doctor --strict in ${image} with ${CARDS} cards"
docker run --rm --network host --ipc host --ulimit memlock=-1:-1 --label trainbox.smoke=1 "${npu[@]}" \
    "$image" trainbox doctor --strict

echo "npu-runner: ${RECIPE} on cards 0-${last}"
code=()
if [ -n "${TWINKLE_DIR:-}" ]; then code=(--set "CODE_DIR=${TWINKLE_DIR}"); fi
trainbox run "$RECIPE" --image "$image" --devices "0-${last}" \
    --set "MODELSCOPE_CACHE=${MODELSCOPE_CACHE}" "${code[@]}" \
    --label trainbox.smoke=1
