"""`python3 -m trainbox.runtime.doctor [--json] [--strict] [--quick]`: the same as `trainbox doctor`."""

import argparse
import sys

from ..errors import TrainboxError
from . import cli

parser = argparse.ArgumentParser(prog="python3 -m trainbox.runtime.doctor", description=cli.DESCRIPTION)
cli.add_arguments(parser)
try:
    sys.exit(cli.run(parser.parse_args()))
except TrainboxError as exc:
    print(f"trainbox doctor: error: {exc}", file=sys.stderr)
    sys.exit(exc.exit_code)
