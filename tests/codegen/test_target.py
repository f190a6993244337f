"""POLYC_CPU: generating and running code for an instruction-set level other than the host's."""
import re

import numpy as np
import pytest

import polyc
from polyc.target import AVX2_CPUS, AVX512_CPUS, host_target, override_cpu
from targets import plain_host as _plain_host

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"


def _asm_registers(monkeypatch, cpu):
    monkeypatch.setenv("POLYC_CPU", cpu)
    kernel = polyc.define(MATMUL)
    rng = np.random.default_rng(0)
    a = rng.random((67, 45), dtype=np.float32)
    b = rng.random((45, 131), dtype=np.float32)
    compiled = kernel.specialize(a, b)
    np.testing.assert_allclose(compiled(a, b), a @ b, rtol=1e-5)
    asm = compiled.stage("asm")
    return len(re.findall(r"%zmm", asm)), len(re.findall(r"%ymm", asm))


def test_avx2_cpu_turns_avx512_off_and_still_computes_right(monkeypatch):
    host = _plain_host()
    if not (host.has_feature("avx2") and host.has_feature("fma")):
        with pytest.raises(polyc.PolycError, match="cannot run AVX2"):
            override_cpu(host, "znver3")
        return
    target = override_cpu(host, "znver3")
    assert (target.cpu, target.vector_bits, target.vector_registers) == ("znver3", 256, 16)
    assert not target.has_feature("avx512f") and target.lanes("float32") == 8
    zmm, ymm = _asm_registers(monkeypatch, "znver3")
    assert zmm == 0 and ymm > 0


def test_avx512_cpu_needs_the_host_to_have_it(monkeypatch):
    host = _plain_host()
    if not host.has_feature("avx512f"):
        with pytest.raises(polyc.PolycError, match="cannot run AVX-512"):
            override_cpu(host, "znver4")
        return
    target = override_cpu(host, "x86-64-v4")
    assert (target.vector_bits, target.vector_registers) == (512, 32)
    zmm, _ = _asm_registers(monkeypatch, "znver5")
    assert zmm > 0


def test_unknown_cpu_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("POLYC_CPU", "pentium3")
    with pytest.raises(polyc.PolycError, match="not a CPU polyc can target") as info:
        host_target()
    assert "znver3" in str(info.value) and set(AVX2_CPUS).isdisjoint(AVX512_CPUS)
