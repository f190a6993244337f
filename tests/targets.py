"""The instruction-set levels a test can generate and run code for on this host (``POLYC_CPU`` values)."""
import os

from polyc.target import host_target


def plain_host():
    """The host's own target, whatever ``POLYC_CPU`` the developer's shell sets."""
    saved = os.environ.pop("POLYC_CPU", None)
    try:
        return host_target()
    finally:
        if saved is not None:
            os.environ["POLYC_CPU"] = saved


#: ``znver3`` (AVX2, 16 registers) on every host the suite supports, and ``znver4`` (AVX-512, 32 registers)
#: where the host runs AVX-512: code for a level the host lacks cannot run here (``override_cpu`` refuses
#: it, tests/codegen/test_target.py), so such a host tests the AVX2 level only.
RUNNABLE_CPUS = ("znver3",) + (("znver4",) if plain_host().has_feature("avx512f") else ())
