"""Argument types for the Python benchmarks' argparse parsers (the C++ ones have bench_args.h): a value out of range
or not a number is a usage error naming the option (exit 2), not a traceback minutes later or a run of something
nobody asked for."""
import argparse

COMPRESSIONS = ["none", "bf16", "int8", "topk", "powersgd"]  # comm.compress's values (src/parallel/compress_method.h)


def _number(kind, lo, strict, what):
    def parse(s):
        try:
            v = kind(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {what}: {s!r}") from None
        if v < lo or (strict and v == lo) or v != v:
            raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {lo}, got {s}")
        return v
    return parse


def int_at_least(lo):
    return _number(int, lo, False, "an integer")


def float_at_least(lo):
    return _number(float, lo, False, "a number")


def float_above(lo):
    return _number(float, lo, True, "a number")


def _each(one):
    def parse(s):
        for x in s.split(","):
            one(x)
        return s
    return parse


def int_list(lo):
    """Comma-separated integers, each >= lo: returns the string unchanged."""
    return _each(int_at_least(lo))


def float_list_above(lo):
    """Comma-separated numbers, each > lo: returns the string unchanged."""
    return _each(float_above(lo))


def names(allowed):
    """Comma-separated names, each one of `allowed` (or "", none given): returns the string unchanged."""
    def parse(s):
        bad = [x for x in s.split(",") if x not in allowed] if s else []
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(bad)} (choose from {', '.join(allowed)})")
        return s
    return parse


def cpu_model():
    """The CPU's model name from /proc/cpuinfo, with its family and model numbers (a VM may name only "AMD EPYC",
    which covers several generations: family 25 is Zen 3 and 4, 26 is Zen 5), or "unknown"."""
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = info.get("model name", "unknown")
    if "cpu family" in info and "model" in info:
        name += " (family %s, model %s)" % (info["cpu family"], info["model"])
    return name
