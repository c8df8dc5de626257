"""Doctor checks: hccl."""

from __future__ import annotations

from ..npu import (
    HCCL_IF_BASE_PORT_MAX,
    HCCL_IF_BASE_PORT_MIN,
    HCCL_IF_BASE_WIDTH,
    HCCL_SOCKET_RANGE_CHIPS_EXCLUDED,
)
from .core import (
    FAIL,
    PASS,
    SKIP,
    WARN,
    Context,
    Result,
    check,
    parse_int,
    read_first_line,
)


@check("hccl.timeouts")
def check_hccl_timeouts(ctx: Context) -> Result:
    """HCCL_CONNECT_TIMEOUT in [120, 7200] s; HCCL_EXEC_TIMEOUT a valid number for the chip and mode."""
    conn, exe = ctx.env.get("HCCL_CONNECT_TIMEOUT"), ctx.env.get("HCCL_EXEC_TIMEOUT")
    data = {"HCCL_CONNECT_TIMEOUT": conn, "HCCL_EXEC_TIMEOUT": exe}
    if conn is None and exe is None:
        return Result(SKIP, "HCCL_CONNECT_TIMEOUT and HCCL_EXEC_TIMEOUT unset (defaults 120 s and 1836 s)")
    if conn is not None:
        v = parse_int(conn)
        if v is None or not 120 <= v <= 7200:
            return Result(FAIL, f"HCCL_CONNECT_TIMEOUT={conn!r} is outside HCCL's range [120, 7200] seconds",
                          "set HCCL_CONNECT_TIMEOUT to an integer from 120 to 7200 (e.g. 1200 for large jobs)", data)
    if exe is not None:
        try:
            v = float(exe)
        except ValueError:
            v = None
        chip = str(((ctx.manifest or {}).get("base") or {}).get("chip") or "").lower()
        limit = 17340 if chip in ("910", "910a", "910pro", "310p") else 2147483647
        if v is None or v < 0 or v > limit or (limit == 17340 and v == 0):
            rng = "(0, 17340]" if limit == 17340 else "[0, 2147483647] (0 = never)"
            return Result(FAIL, f"HCCL_EXEC_TIMEOUT={exe!r} is outside HCCL's range {rng} seconds",
                          "set HCCL_EXEC_TIMEOUT to a number of seconds in range (default 1836)", data)
        if (ctx.env.get("HCCL_OP_EXPANSION_MODE") or "").upper() == "AIV" and (v == 0 or v > 1091):
            return Result(WARN, f"HCCL_EXEC_TIMEOUT={exe} with HCCL_OP_EXPANSION_MODE=AIV: AIV mode caps the "
                                "timeout at 1091 s, so this value acts as 1091",
                          "set HCCL_EXEC_TIMEOUT<=1091, or use another expansion mode if collectives need longer",
                          data)
    parts = [f"{k}={v}" for k, v in data.items() if v is not None]
    return Result(PASS, ", ".join(parts) + " within range", data=data)


_EXPANSION_MODES = ("AI_CPU", "AIV", "HOST", "HOST_TS", "AICPU_CACHEDISABLE")


@check("hccl.options")
def check_hccl_options(ctx: Context) -> Result:
    """HCCL_BUFFSIZE is a positive MB count; HCCL_OP_EXPANSION_MODE is a known mode; HCCL_IF_IP is an IP."""
    names = ("HCCL_BUFFSIZE", "HCCL_OP_EXPANSION_MODE", "HCCL_IF_IP", "HCCL_SOCKET_IFNAME")
    data = {n: ctx.env.get(n) for n in names}
    if all(v is None for v in data.values()):
        return Result(SKIP, "no HCCL options set (HCCL_BUFFSIZE defaults to 200 MB)")
    buf = data["HCCL_BUFFSIZE"]
    if buf is not None and (parse_int(buf) is None or parse_int(buf) < 1):
        return Result(FAIL, f"HCCL_BUFFSIZE={buf!r} is not a positive number of MB",
                      "set HCCL_BUFFSIZE to an integer MB count (default 200)", data)
    mode = data["HCCL_OP_EXPANSION_MODE"]
    if mode is not None and mode.upper() not in _EXPANSION_MODES:
        return Result(WARN, f"HCCL_OP_EXPANSION_MODE={mode!r} is not a mode HCCL documents (AI_CPU, AIV, HOST, "
                            "HOST_TS)", "use AI_CPU or AIV, or unset it for the default", data)
    ip = data["HCCL_IF_IP"]
    if ip is not None:
        import ipaddress

        try:
            ipaddress.ip_address(ip.strip())
        except ValueError:
            return Result(FAIL, f"HCCL_IF_IP={ip!r} is not an IP address",
                          "set HCCL_IF_IP to this host's address on the training network, or use "
                          "HCCL_SOCKET_IFNAME=<nic> instead", data)
    if ip and data["HCCL_SOCKET_IFNAME"]:
        return Result(WARN, "both HCCL_IF_IP and HCCL_SOCKET_IFNAME are set; HCCL_IF_IP wins",
                      "keep one of them", data)
    return Result(PASS, ", ".join(f"{k}={v}" for k, v in data.items() if v is not None), data=data)


def _parse_ports(value: str) -> tuple[list[tuple[int, int]] | None, str | None]:
    spans = []
    for part in value.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        a, b = parse_int(lo) if lo else None, (parse_int(hi) if sep else parse_int(lo) if lo else None)
        if a is None or b is None:
            return None, f"{part!r} is not a port or a range lo-hi"
        if not (1 <= a <= 65535 and 1 <= b <= 65535) or a > b:
            return None, f"{part!r} is outside 1-65535 or reversed"
        spans.append((a, b))
    return spans, None


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


@check("hccl.ports")
def check_hccl_ports(ctx: Context) -> Result:
    """HCCL host/NPU socket port ranges are well formed, disjoint, above 1023 and out of the ephemeral range."""
    names = ("HCCL_HOST_SOCKET_PORT_RANGE", "HCCL_NPU_SOCKET_PORT_RANGE", "HCCL_IF_BASE_PORT", "MASTER_PORT")
    data = {n: ctx.env.get(n) for n in names}
    if all(data[n] is None for n in names[:3]):
        return Result(SKIP, "no HCCL port settings (HCCL picks from HCCL_IF_BASE_PORT, default 60000)")
    ranges = {}
    for name in names[:2]:
        value = data[name]
        if value is None or value.strip().lower() == "auto":
            continue
        spans, err = _parse_ports(value)
        if spans is None:
            return Result(FAIL, f"{name}={value!r}: {err}",
                          f"write {name} as ports and ranges such as 60000-60050,60100, or 'auto'", data)
        for i, s in enumerate(spans):
            for t in spans[i + 1:]:
                if _overlaps(s, t):
                    return Result(FAIL, f"{name}={value!r}: {s[0]}-{s[1]} and {t[0]}-{t[1]} overlap",
                                  f"make the parts of {name} disjoint", data)
        ranges[name] = spans
    base = data["HCCL_IF_BASE_PORT"]
    if base is not None:
        b = parse_int(base)
        if b is None or not HCCL_IF_BASE_PORT_MIN <= b <= HCCL_IF_BASE_PORT_MAX:
            return Result(FAIL, f"HCCL_IF_BASE_PORT={base!r} is not a port in "
                          f"{HCCL_IF_BASE_PORT_MIN}-{HCCL_IF_BASE_PORT_MAX}",
                          f"set HCCL_IF_BASE_PORT to an unused port (HCCL takes {HCCL_IF_BASE_WIDTH} ports from it "
                          "since CANN 8.3; default 60000)", data)
    warn = []
    chip = (((ctx.manifest or {}).get("base") or {}).get("chip") or "").lower()
    if ranges and chip in HCCL_SOCKET_RANGE_CHIPS_EXCLUDED:
        warn.append(f"HCCL socket port ranges are set on an Atlas A2 ({chip}) stack: they are not supported with "
                    "MC2 fused operators (MindSpeed --use-ascend-mc2) and must be set identically on every card of "
                    "a communicator; prefer a per-job HCCL_IF_BASE_PORT (trainbox derives one from MASTER_PORT)")
    for name, spans in ranges.items():
        if any(lo < 1024 for lo, _ in spans):
            warn.append(f"{name} reaches below 1024 (system ports)")
    mp = parse_int(data["MASTER_PORT"]) if data["MASTER_PORT"] else None
    if mp:
        for name, spans in ranges.items():
            if any(lo <= mp <= hi for lo, hi in spans):
                warn.append(f"MASTER_PORT={mp} lies inside {name}")
    eph = read_first_line(ctx.path("/proc/sys/net/ipv4/ip_local_port_range"))
    reserved = read_first_line(ctx.path("/proc/sys/net/ipv4/ip_local_reserved_ports")) or ""
    if eph:
        try:
            lo, hi = (int(x) for x in eph.split())
            res_spans = _parse_ports(reserved)[0] if reserved.strip() else []
            for name, spans in ranges.items():
                for s in spans:
                    covered = any(r[0] <= s[0] and s[1] <= r[1] for r in res_spans or [])
                    if _overlaps(s, (lo, hi)) and not covered:
                        warn.append(f"{name} {s[0]}-{s[1]} overlaps the ephemeral range {lo}-{hi}, where the "
                                    "kernel hands out ports to outgoing connections")
                        break
        except ValueError:
            pass
    if warn:
        fix = ("move the ranges above the ephemeral range (e.g. 61000+) or reserve them (sysctl "
               "net.ipv4.ip_local_reserved_ports), and keep MASTER_PORT outside them")
        if "Atlas A2" in warn[0]:
            fix = ("unset HCCL_HOST_SOCKET_PORT_RANGE/HCCL_NPU_SOCKET_PORT_RANGE and give each job its own "
                   "HCCL_IF_BASE_PORT; keep the ranges only if every card of the communicator sets the same ones "
                   "and MC2 is off")
        return Result(WARN, "; ".join(warn), fix, data)
    msg = ", ".join(f"{k}={v}" for k, v in data.items() if v is not None)
    if chip in HCCL_SOCKET_RANGE_CHIPS_EXCLUDED and base is not None and not ranges:
        msg += (f" (Atlas A2: a per-job HCCL_IF_BASE_PORT block of {HCCL_IF_BASE_WIDTH} ports, not socket port "
                "ranges, which MC2 fused operators do not support)")
    return Result(PASS, msg, data=data)


if __name__ == "__main__":  # `python3 -m` on a library module must fail loudly, not pass silently
    from trainbox.runtime.errors import not_a_command

    raise SystemExit(not_a_command(__spec__.name))
