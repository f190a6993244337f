"""The disk cache against tampering (issue 16, item 10): forged, truncated, misplaced and pickled entries are
never loaded (a miss, the kernel rebuilt, the result correct), and the JIT never hands LLVM a malformed object.

The scenarios that load tampered entries run in a child process, so a regression shows up as a failed test
with the child's exit status instead of a crashed test session."""
import hashlib
import os
import pickle
import random
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import polyc
from polyc.codegen import host_target, load_object
from polyc.codegen.jit import check_object
from polyc.errors import CompileError
from polyc.runtime import cache

ADD = "def add(float(N,M) A, float(N,M) B) -> (C) { C(i,j) = A(i,j) + B(i,j) * 2.0 }"


def entries(directory):
    return {p.name: p for p in directory.glob("*.polyc")}


def child(directory, body: str) -> str:
    """Run ``body`` in a fresh interpreter with the disk cache in ``directory``; its stdout (fails on a
    crash or an exception, showing stderr)."""
    script = "import numpy as np, polyc\nfrom polyc.runtime import cache\n" + textwrap.dedent(body)
    env = dict(os.environ, POLYC_CACHE_DIR=str(directory))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"child exited with {done.returncode}:\n{done.stderr[-3000:]}"
    return done.stdout


#: Compile ADD at N x M in a fresh process: prints whether it came from disk and whether the result is right.
RUN = """
n, m = {n}, {m}
k = polyc.define({src!r})
a = np.random.default_rng(0).standard_normal((n, m)).astype(np.float32)
b = np.random.default_rng(1).standard_normal((n, m)).astype(np.float32)
c = k(a, b)
ok = c.shape == (n, m) and np.allclose(c, a + 2 * b, rtol=1e-6)
print("DISK" if k.specialize(a, b)._stages is None else "COMPILED", "OK" if ok else f"WRONG {{c.shape}}")
"""


def run(directory, n=4, m=5):
    return child(directory, RUN.format(n=n, m=m, src=ADD)).split()


def object_entry(directory, before=(), tier="kernel"):
    """The entry holding object code (not a signature) among those created after ``before``: the kernel's
    own (``tier="kernel"``, which also lists its tensors) or the one keyed by its LLVM IR (``"ir"``)."""
    found = [p for name, p in entries(directory).items() if name not in before and b'"object"' in p.read_bytes()
             and (b'"tensors"' in p.read_bytes()) == (tier == "kernel")]
    assert len(found) == 1, found
    return found[0]


def test_a_forged_object_with_a_valid_mac_is_rejected_and_rebuilt(tmp_path):
    # the strongest forger: one who can sign (stores through the cache's own API) random object bytes
    assert run(tmp_path) == ["COMPILED", "OK"]
    entry = object_entry(tmp_path)
    key = entry.stem
    out = child(tmp_path, f"""
        import random
        value = cache.load({key!r})
        assert value is not None and value["object"][:4] == b"\\x7fELF"
        value["object"] = bytes(random.Random(0).getrandbits(8) for _ in range(len(value["object"])))
        cache.store({key!r}, value)
        forged = cache.load({key!r}); assert forged is not None  # the MAC is valid: only the ELF check stops it
        cache.store({key!r}, forged)
    """)
    assert out == ""
    assert run(tmp_path) == ["COMPILED", "OK"]
    assert run(tmp_path) == ["DISK", "OK"]


def test_a_forged_object_under_the_ir_key_is_rejected_and_rebuilt(tmp_path):
    # the object keyed by the LLVM IR is read when the kernel's own entry is missing: forged, it is rejected too
    assert run(tmp_path) == ["COMPILED", "OK"]
    key = object_entry(tmp_path, tier="ir").stem
    child(tmp_path, f"""
        import random
        value = cache.load({key!r})
        value["object"] = bytes(random.Random(2).getrandbits(8) for _ in range(len(value["object"])))
        cache.store({key!r}, value)
    """)
    object_entry(tmp_path).unlink()
    assert run(tmp_path) == ["COMPILED", "OK"]
    assert run(tmp_path) == ["DISK", "OK"]


def test_option_sets_that_lower_to_the_same_ir_share_one_object(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path))
    import polyc.kernel
    calls = []
    real = polyc.kernel.compile_module
    monkeypatch.setattr(polyc.kernel, "compile_module", lambda *a: calls.append(a[0]) or real(*a))
    a = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    plain = polyc.define(ADD).specialize(a, a)
    # tiles larger than the loops: no tiling, the same IR; the object comes from the cache, not from LLVM
    big_tiles = polyc.define(ADD, options=polyc.Options(tile_sizes=(64,))).specialize(a, a)
    assert big_tiles.stage("llvm") == plain.stage("llvm")
    assert len(calls) == 1 and calls[0] == plain.stage("llvm")
    np.testing.assert_array_equal(big_tiles(a, a), a + a * 2)
    assert big_tiles.stage("asm") == plain.stage("asm") and "vmov" in plain.stage("asm")
    # another shape lowers to other IR: compiled
    b = np.ones((6, 7), np.float32)
    polyc.define(ADD).specialize(b, b)
    assert len(calls) == 2


def test_random_bytes_with_a_recomputed_checksum_are_rejected(tmp_path):
    # a forger without the directory's secret: a plain sha256 where the MAC goes does not verify
    assert run(tmp_path) == ["COMPILED", "OK"]
    entry = object_entry(tmp_path)
    data = entry.read_bytes()
    magic, _mac, body = data.split(b"\n", 2)
    header, _, blob = body.partition(b"\n")
    body = header + b"\n" + bytes(random.Random(1).getrandbits(8) for _ in blob)
    entry.write_bytes(magic + b"\n" + hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
    assert run(tmp_path) == ["COMPILED", "OK"]
    assert run(tmp_path) == ["DISK", "OK"]


@pytest.mark.parametrize("keep", [0.25, 0.5, 0.9, 0.999])
def test_a_truncated_object_with_a_valid_mac_is_rejected(tmp_path, keep):
    assert run(tmp_path) == ["COMPILED", "OK"]
    key = object_entry(tmp_path).stem
    child(tmp_path, f"""
        value = cache.load({key!r})
        value["object"] = value["object"][:int(len(value["object"]) * {keep})]
        cache.store({key!r}, value)
    """)
    assert run(tmp_path) == ["COMPILED", "OK"]
    assert run(tmp_path) == ["DISK", "OK"]


def test_an_entry_copied_over_another_kernels_key_is_a_miss(tmp_path):
    assert run(tmp_path, 32, 32) == ["COMPILED", "OK"]
    small = object_entry(tmp_path)
    before = set(entries(tmp_path))
    assert run(tmp_path, 512, 512) == ["COMPILED", "OK"]
    big = object_entry(tmp_path, before)
    small.write_bytes(big.read_bytes())  # a valid, signed entry under the wrong name
    assert run(tmp_path, 32, 32) == ["COMPILED", "OK"]  # not the 512x512 kernel reading past 32x32 inputs
    assert run(tmp_path, 32, 32) == ["DISK", "OK"]
    assert run(tmp_path, 512, 512) == ["DISK", "OK"]


def test_entries_are_never_unpickled(tmp_path, monkeypatch):
    # an old-format entry whose payload would run code when unpickled: loading it must execute nothing
    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path))
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    payload = pickle.dumps({"object": Evil()})
    key = cache.make_key("evil")
    cache.store(key, {"x": 1})  # creates the directory's secret
    (tmp_path / f"{key}.polyc").write_bytes(b"POLYC1\n" + hashlib.sha256(payload).hexdigest().encode()
                                            + b"\n" + payload)
    assert cache.load(key) is None
    assert not marker.exists()
    assert not (tmp_path / f"{key}.polyc").exists()


def test_round_trip_of_json_fields_and_blobs(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path))
    key = cache.make_key("round trip")
    cache.store(key, {"tensors": [["A", "float32", [3, 4], "input"]], "object": b"\0\1\2\n", "more": b"xyz"})
    assert cache.load(key) == {"tensors": [["A", "float32", [3, 4], "input"]], "object": b"\0\1\2\n",
                               "more": b"xyz"}
    secret = tmp_path / "secret"
    assert secret.stat().st_mode & 0o777 == 0o600
    # a secret others can read is not trusted: the cache is off (a miss), not fooled
    secret.chmod(0o644)
    assert cache.load(key) is None
    secret.chmod(0o600)
    cache.store(key, {"a": 1})
    assert cache.load(key) == {"a": 1}
    # the key inside the entry must match the file's name
    other = cache.make_key("other")
    (tmp_path / f"{other}.polyc").write_bytes((tmp_path / f"{key}.polyc").read_bytes())
    assert cache.load(other) is None and cache.load(key) == {"a": 1}


# ---- the JIT's object check, in-process: none of these reaches LLVM --------------------------------------

TARGET = host_target()


@pytest.fixture(scope="module")
def good_object():
    k = polyc.define(ADD)
    compiled = k.specialize((3, 3), (3, 3))
    return compiled._jit.object_code


def test_check_object_accepts_a_real_object(good_object):
    check_object(good_object, TARGET, ("polyc.add",))
    jit = load_object(good_object, TARGET, ("polyc.add",))
    assert jit.address("polyc.add")


def test_check_object_rejects_garbage_truncation_and_missing_symbols(good_object):
    rng = random.Random(2)
    cases = [b"", b"\x7fELF", bytes(rng.getrandbits(8) for _ in range(len(good_object)))]
    cases += [good_object[:n] for n in range(0, len(good_object), max(1, len(good_object) // 97))]
    for data in cases:
        with pytest.raises(CompileError, match="malformed object"):
            check_object(data, TARGET, ("polyc.add",))
        with pytest.raises(CompileError, match="malformed object"):
            load_object(data, TARGET, ("polyc.add",))
    with pytest.raises(CompileError, match="does not define polyc.nope"):
        check_object(good_object, TARGET, ("polyc.nope",))
    wrong_machine = good_object[:18] + (40).to_bytes(2, "little") + good_object[20:]  # ARM
    with pytest.raises(CompileError, match="ELF machine 40"):
        check_object(wrong_machine, TARGET)


def test_check_object_survives_random_byte_flips(good_object):
    # flipped bytes either pass the structural check (then the MAC is what stops them) or raise CompileError:
    # never an IndexError or struct.error
    rng = random.Random(3)
    for _ in range(300):
        data = bytearray(good_object)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.getrandbits(8)
        try:
            check_object(bytes(data), TARGET, ("polyc.add",))
        except CompileError:
            pass
