"""The parallel runtime: one process-wide pool of worker threads, written in LLVM IR.

Every ``parallel`` loop of every kernel calls one function of this module::

    void @polyc_parallel_run(ptr %chunk, ptr %contexts, i64 %context_bytes, i64 %n)

which runs ``chunk(contexts + i * context_bytes)`` for ``i`` in ``[0, n)``: chunk 0 on the calling thread,
chunk ``i`` on worker ``i - 1``, and returns when all are done. Starting a thread costs about 60 us on a
virtual machine (``pthread_create`` + ``pthread_join``: longer than many kernels), handing a chunk to a
waiting worker well under 1 us, so the workers are created once, on first use, and kept.

Each worker owns one 128-byte slot (its own cache lines: no false sharing between workers)::

    { i32 gen, i32 sleeping, ptr chunk, ptr context, i32 claim, i32, i64 thread, [24 x i8], i32 done, [60 x i8] }

The caller writes ``chunk`` and ``context``, clears ``claim``, then bumps ``gen`` (sequentially
consistent); the worker, spinning on ``gen`` with ``pause``, takes the chunk by ``claim: 0 -> 1``
(``cmpxchg``), runs it, and stores ``done = gen`` (release). A worker that sees no work for
:data:`SPIN_ITERATIONS` spins sleeps in ``futex(FUTEX_WAIT)`` on ``gen`` after raising ``sleeping``; the
caller wakes it (``FUTEX_WAKE``) when it sees ``sleeping`` after its bump (the two sequentially consistent
store-then-load pairs cannot both miss each other).

After its own chunk the caller *steals* every posted chunk no worker has claimed yet (``claim: 0 -> 2``)
and runs it itself; it waits only for chunks a worker is running. A worker that is slow to wake (a futex
wake-up on a virtual machine, or a core held by another library's spinning threads, such as OpenBLAS's
right after a numpy call) then costs nothing: the caller does the work, as one thread would. A caller posts
to a slot only when its worker has acknowledged the previous job (``done == gen``; a worker whose chunk was
stolen still acknowledges it), else it runs that chunk itself, so a slot is never rewritten under a worker.

Before posting, the caller keeps the workers off its own CPU (``pthread_setaffinity_np`` with the
process's CPUs minus the caller's, redone only when the caller's CPU changes; nothing when the process has
one CPU). Without it the guest scheduler of a small VM was seen leaving a worker woken from futex on the
caller's CPU for many milliseconds while the other CPU idled: two threads ran at one thread's speed in a
quarter to a half of the calls that followed a pause.

One caller at a time owns the pool (``busy``, taken with ``cmpxchg``): a second caller — another Python
thread calling a kernel, with the GIL released — runs its chunks one after another on its own thread.
After ``fork`` the child has no workers (threads do not survive it): the pool remembers the pid that
created its workers and starts afresh in another process. When a worker cannot be created the caller
runs that chunk itself. At most :data:`MAX_WORKERS` workers exist; further chunks run on the caller.
"""
from __future__ import annotations

from llvmlite import ir

from . import expr as X

I8, I32, I64, PTR = X.I8, X.I32, X.I64, X.PTR

#: The function every parallel loop calls (external linkage; registered with the JIT's symbol table).
PARALLEL_RUN = "polyc_parallel_run"

#: Workers the pool can hold (chunks beyond ``MAX_WORKERS + 1`` run on the calling thread).
MAX_WORKERS = 63

#: ``pause`` iterations a worker spins before it sleeps in futex (about 2 ms at ~40 ns per pause): long
#: enough to stay awake between the kernels of a model or back-to-back calls, short enough not to steal a
#: core from other work for long.
SPIN_ITERATIONS = 1 << 16

_SYS_FUTEX = 202  # x86-64 Linux
_FUTEX_WAIT_PRIVATE, _FUTEX_WAKE_PRIVATE = 128, 129

SLOT = ir.LiteralStructType([I32, I32, PTR, PTR, I32, I32, I64, ir.ArrayType(I8, 24), I32, ir.ArrayType(I8, 60)])
_GEN, _SLEEPING, _CHUNK, _CONTEXT, _CLAIM, _TID, _DONE = 0, 1, 2, 3, 4, 6, 8

#: ``cpu_set_t`` as glibc defines it: 1024 bits.
_CPU_SET = ir.ArrayType(I64, 16)
_CHUNK_FN = ir.FunctionType(PTR, [PTR])


def _store(b: ir.IRBuilder, value: ir.Value, pointer: ir.Value, ordering: str) -> None:
    """An atomic store with ``ordering``, as ``atomicrmw xchg`` (llvmlite's ``store_atomic`` wants typed
    pointers; on x86 a sequentially consistent store is an ``xchg`` anyway)."""
    b.atomic_rmw("xchg", pointer, value, ordering)


def declare_parallel_run(module: ir.Module) -> ir.Function:
    """The declaration of :data:`PARALLEL_RUN` in a kernel's module (defined by :func:`pool_module`)."""
    return X.declare(module, PARALLEL_RUN, ir.FunctionType(ir.VoidType(), [PTR, PTR, I64, I64]))


def pool_module(triple: str) -> ir.Module:
    """The LLVM module defining :data:`PARALLEL_RUN` and the worker loop (see the module docstring).

    ``triple`` is the target triple: ``pause`` (``llvm.x86.sse2.pause``) is used on x86 only; the futex
    system call number is Linux x86-64's.
    """
    module = ir.Module(name="polyc.pool")
    module.triple = triple
    slots_ty = ir.ArrayType(SLOT, MAX_WORKERS)
    slots = ir.GlobalVariable(module, slots_ty, "polyc.pool.slots")
    slots.initializer = ir.Constant(slots_ty, None)
    slots.linkage, slots.align = "internal", 128
    slots.type = PTR  # opaque, as everywhere else (llvmlite types globals as T*)
    state = {"slots": slots}
    for name, ty in (("workers", I64), ("busy", I32), ("pid", I32), ("caller_cpu", I32), ("allowed", _CPU_SET)):
        g = ir.GlobalVariable(module, ty, f"polyc.pool.{name}")
        g.initializer = ir.Constant(ty, None)
        g.linkage, g.align = "internal", 64
        g.type = PTR
        state[name] = g
    syscall = X.declare(module, "syscall", ir.FunctionType(I64, [I64], var_arg=True))
    pause = (X.declare(module, "llvm.x86.sse2.pause", ir.FunctionType(ir.VoidType(), []))
             if triple.startswith(("x86_64", "i686", "i386")) else None)

    def field(b: ir.IRBuilder, slot: ir.Value, i: int) -> ir.Value:
        return b.gep(slot, [ir.Constant(I32, 0), ir.Constant(I32, i)], inbounds=True, source_etype=SLOT)

    def slot_at(b: ir.IRBuilder, w: ir.Value) -> ir.Value:
        return b.gep(slots, [ir.Constant(I64, 0), w], inbounds=True, source_etype=slots_ty)

    def relax(b: ir.IRBuilder) -> None:
        if pause is not None:
            b.call(pause, [])

    def futex(b: ir.IRBuilder, word: ir.Value, op: int, value: ir.Value) -> None:
        b.call(syscall, [ir.Constant(I64, _SYS_FUTEX), word, ir.Constant(I64, op), b.zext(value, I64),
                         ir.Constant(PTR, None)])

    worker = _worker(module, field, relax, futex)
    _parallel_run(module, state, slots_ty, slot_at, field, relax, futex, worker)
    return module


def _worker(module, field, relax, futex) -> ir.Function:
    """``ptr @polyc.pool.worker(ptr %slot)``: wait for a job on the slot, run it, store ``done``, forever."""
    fn = ir.Function(module, _CHUNK_FN, "polyc.pool.worker")
    fn.linkage = "internal"
    slot = fn.args[0]
    entry, wait, spin, sleep, run = (fn.append_basic_block(n) for n in ("entry", "wait", "spin", "sleep", "run"))
    b = X.Builder(entry)
    b.branch(wait)

    b.position_at_end(wait)  # seen: the last job run (slots start at gen 0, before any job)
    seen = b.phi(I32, "seen")
    seen.add_incoming(ir.Constant(I32, 0), entry)
    b.branch(spin)

    b.position_at_end(spin)
    count = b.phi(I32, "count")
    count.add_incoming(ir.Constant(I32, 0), wait)
    gen = b.load_atomic(field(b, slot, _GEN), "acquire", 4, typ=I32)
    new_job = b.icmp_unsigned("!=", gen, seen)
    spinning = b.append_basic_block("spinning")
    b.cbranch(new_job, run, spinning)
    b.position_at_end(spinning)
    relax(b)
    more = b.add(count, ir.Constant(I32, 1))
    count.add_incoming(more, spinning)
    b.cbranch(b.icmp_unsigned("<", more, ir.Constant(I32, SPIN_ITERATIONS)), spin, sleep)

    b.position_at_end(sleep)  # announce the sleep, look once more, then wait in the kernel while gen == seen
    _store(b, ir.Constant(I32, 1), field(b, slot, _SLEEPING), "seq_cst")
    now = b.load_atomic(field(b, slot, _GEN), "seq_cst", 4, typ=I32)
    with b.if_then(b.icmp_unsigned("==", now, seen)):
        futex(b, field(b, slot, _GEN), _FUTEX_WAIT_PRIVATE, seen)
    _store(b, ir.Constant(I32, 0), field(b, slot, _SLEEPING), "seq_cst")
    seen.add_incoming(seen, b.block)
    b.branch(wait)

    b.position_at_end(run)  # claim the chunk (the caller may have stolen it), run it, acknowledge the job
    claimed = b.cmpxchg(field(b, slot, _CLAIM), ir.Constant(I32, 0), ir.Constant(I32, 1), "acq_rel", "acquire")
    with b.if_then(b.extract_value(claimed, 1)):
        chunk = b.load(field(b, slot, _CHUNK), typ=_CHUNK_FN.as_pointer())  # typed: llvmlite calls through it
        context = b.load(field(b, slot, _CONTEXT), typ=PTR)
        b.call(chunk, [context])
    _store(b, gen, field(b, slot, _DONE), "release")
    seen.add_incoming(gen, b.block)
    b.branch(wait)
    return fn


def _parallel_run(module, state, slots_ty, slot_at, field, relax, futex, worker) -> ir.Function:
    """``void @polyc_parallel_run(ptr chunk, ptr contexts, i64 context_bytes, i64 n)`` (module docstring)."""
    # the chunk argument typed as a function pointer, so llvmlite can call through it (LLVM reads it as ptr)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [_CHUNK_FN.as_pointer(), PTR, I64, I64]), PARALLEL_RUN)
    for arg, name in zip(fn.args, ("chunk", "contexts", "context_bytes", "n")):
        arg.name = name
    chunk, contexts, size, n = fn.args
    create = X.declare(module, "pthread_create", ir.FunctionType(I32, [PTR, PTR, PTR, PTR]))
    detach = X.declare(module, "pthread_detach", ir.FunctionType(I32, [I64]))
    getpid = X.declare(module, "getpid", ir.FunctionType(I32, []))
    getcpu = X.declare(module, "sched_getcpu", ir.FunctionType(I32, []))
    getaffinity = X.declare(module, "sched_getaffinity", ir.FunctionType(I32, [I32, I64, PTR]))
    setaffinity = X.declare(module, "pthread_setaffinity_np", ir.FunctionType(I32, [I64, I64, PTR]))
    entry = fn.append_basic_block("entry")
    b = X.Builder(entry)
    tid = b.alloca(I64, name="tid")
    mask = b.alloca(_CPU_SET, name="mask")
    mask.type = PTR
    posted = b.alloca(ir.ArrayType(I8, MAX_WORKERS), name="posted")
    posted.type = PTR
    one, zero = ir.Constant(I64, 1), ir.Constant(I64, 0)

    def context_at(bb: ir.IRBuilder, i: ir.Value) -> ir.Value:
        return bb.gep(contexts, [bb.mul(i, size)], source_etype=I8)

    def count(bb: ir.IRBuilder, name: str, lo: ir.Value, hi: ir.Value, emit) -> None:
        """``for (i = lo; i < hi; i++) emit(bb, i)``, continuing after the loop."""
        head, body, done = (bb.append_basic_block(f"{name}.{x}") for x in ("head", "body", "done"))
        pre = bb.block
        bb.branch(head)
        bb.position_at_end(head)
        i = bb.phi(I64, "i")
        i.add_incoming(lo, pre)
        bb.cbranch(bb.icmp_signed("<", i, hi), body, done)
        bb.position_at_end(body)
        emit(bb, i)
        i.add_incoming(bb.add(i, one), bb.block)
        bb.branch(head)
        bb.position_at_end(done)

    def serial(bb: ir.IRBuilder, lo: ir.Value) -> None:
        """Run chunks ``lo .. n-1`` here, one after another."""
        count(bb, "serial", lo, n, lambda b_, i: b_.call(chunk, [context_at(b_, i)]))

    def each_worker(bb: ir.IRBuilder, what: str, emit) -> None:
        each_worker_upto(bb, what, emit, workers)

    def each_worker_upto(bb: ir.IRBuilder, what: str, emit, upto: ir.Value) -> None:
        count(bb, what, zero, upto, lambda b_, w: emit(b_, w, slot_at(b_, w)))

    alone = fn.append_basic_block("alone")
    claim = fn.append_basic_block("claim")
    pooled = fn.append_basic_block("pooled")
    b.cbranch(b.icmp_signed(">", n, one), claim, alone)
    b.position_at_end(claim)
    owned = b.cmpxchg(state["busy"], ir.Constant(I32, 0), ir.Constant(I32, 1), "acquire", "monotonic")
    b.cbranch(b.extract_value(owned, 1), pooled, alone)

    b.position_at_end(alone)  # one chunk, or the pool belongs to another caller
    serial(b, zero)
    b.ret_void()

    b.position_at_end(pooled)
    pid = b.call(getpid, [])
    with b.if_then(b.icmp_signed("!=", pid, b.load(state["pid"], typ=I32))):
        # a new process (or the first call): no worker of ours runs here; slots start from zero again
        b.store(ir.Constant(slots_ty, None), state["slots"])
        b.store(zero, state["workers"])
        b.store(pid, state["pid"])
        with b.if_then(b.icmp_signed("!=", b.call(getaffinity, [ir.Constant(I32, 0), ir.Constant(I64, 128),
                                                                state["allowed"]]), ir.Constant(I32, 0))):
            b.store(ir.Constant(_CPU_SET, None), state["allowed"])  # unknown: never restrict the workers
    want = b.sub(n, one)
    want = b.select(b.icmp_signed("<", want, ir.Constant(I64, MAX_WORKERS)), want, ir.Constant(I64, MAX_WORKERS))

    # create workers up to `want` (a failed pthread_create stops there: the caller runs the rest)
    head, body, made = (fn.append_basic_block(x) for x in ("create.head", "create.body", "create.done"))
    b.branch(head)
    b.position_at_end(head)
    have = b.load(state["workers"], typ=I64)
    b.cbranch(b.icmp_signed("<", have, want), body, made)
    b.position_at_end(body)
    rc = b.call(create, [tid, ir.Constant(PTR, None), worker, slot_at(b, have)])
    created = fn.append_basic_block("create.ok")
    b.cbranch(b.icmp_signed("==", rc, ir.Constant(I32, 0)), created, made)
    b.position_at_end(created)
    b.call(detach, [b.load(tid, typ=I64)])
    b.store(b.load(tid, typ=I64), field(b, slot_at(b, have), _TID))
    b.store(b.add(have, one), state["workers"])
    b.store(ir.Constant(I32, -1), state["caller_cpu"])  # the new worker's affinity is set below
    b.branch(head)

    b.position_at_end(made)
    have = b.load(state["workers"], typ=I64)
    workers = b.select(b.icmp_signed("<", have, want), have, want)

    # keep the workers off the caller's CPU: the guest scheduler of a small VM can leave a waking worker
    # beside the caller for many milliseconds while another CPU idles (seen on 2 vCPUs: 2 threads at 1-thread
    # speed). One pthread_setaffinity_np per worker, only when the caller's CPU changed since last time.
    cpu = b.call(getcpu, [])
    known = b.icmp_unsigned("<", cpu, ir.Constant(I32, 64 * _CPU_SET.count))  # -1 (unknown) is huge unsigned
    moved = b.and_(known, b.icmp_signed("!=", cpu, b.load(state["caller_cpu"], typ=I32)))
    with b.if_then(moved):
        b.store(cpu, state["caller_cpu"])
        word = b.lshr(b.zext(cpu, I64), ir.Constant(I64, 6))
        bit = b.shl(one, b.and_(b.zext(cpu, I64), ir.Constant(I64, 63)))
        b.store(b.load(state["allowed"], typ=_CPU_SET), mask)
        word_at = b.gep(mask, [zero, word], source_etype=_CPU_SET)
        b.store(b.and_(b.load(word_at, typ=I64), b.not_(bit)), word_at)
        any_other = ir.Constant(ir.IntType(1), 0)
        for k in range(_CPU_SET.count):  # another allowed CPU in any word?
            any_other = b.or_(any_other, b.icmp_unsigned(
                "!=", b.load(b.gep(mask, [zero, ir.Constant(I64, k)], source_etype=_CPU_SET), typ=I64), zero))
        with b.if_then(any_other):
            def pin(bb: ir.IRBuilder, w: ir.Value, slot: ir.Value) -> None:
                bb.call(setaffinity, [bb.load(field(bb, slot, _TID), typ=I64), ir.Constant(I64, 128), mask])
            each_worker_upto(b, "pin", pin, have)

    # per worker (`posted`, in the entry block): 0 = its chunk runs here, 1 = posted to it, 2 = posted, then
    # stolen back and run here

    def state_of(bb: ir.IRBuilder, w: ir.Value) -> ir.Value:
        return bb.gep(posted, [zero, w], inbounds=True, source_etype=ir.ArrayType(I8, MAX_WORKERS))

    def run_here(bb: ir.IRBuilder, w: ir.Value) -> None:
        bb.call(chunk, [context_at(bb, bb.add(w, one))])

    def post(bb: ir.IRBuilder, w: ir.Value, slot: ir.Value) -> None:
        gen = bb.load(field(bb, slot, _GEN), typ=I32)
        idle = bb.icmp_unsigned("==", bb.load_atomic(field(bb, slot, _DONE), "acquire", 4, typ=I32), gen)
        bb.store(ir.Constant(I8, 0), state_of(bb, w))
        with bb.if_then(idle):  # the worker acknowledged its last job: the slot is ours to write
            bb.store(chunk, field(bb, slot, _CHUNK))
            bb.store(context_at(bb, bb.add(w, one)), field(bb, slot, _CONTEXT))
            bb.store(ir.Constant(I32, 0), field(bb, slot, _CLAIM))
            _store(bb, bb.add(gen, ir.Constant(I32, 1)), field(bb, slot, _GEN), "seq_cst")
            asleep = bb.load_atomic(field(bb, slot, _SLEEPING), "seq_cst", 4, typ=I32)
            with bb.if_then(bb.icmp_unsigned("!=", asleep, ir.Constant(I32, 0))):
                futex(bb, field(bb, slot, _GEN), _FUTEX_WAKE_PRIVATE, ir.Constant(I32, 1))
            bb.store(ir.Constant(I8, 1), state_of(bb, w))

    def unposted(bb: ir.IRBuilder, w: ir.Value, slot: ir.Value) -> None:
        with bb.if_then(bb.icmp_unsigned("==", bb.load(state_of(bb, w), typ=I8), ir.Constant(I8, 0))):
            run_here(bb, w)

    def steal(bb: ir.IRBuilder, w: ir.Value, slot: ir.Value) -> None:
        with bb.if_then(bb.icmp_unsigned("==", bb.load(state_of(bb, w), typ=I8), ir.Constant(I8, 1))):
            taken = bb.cmpxchg(field(bb, slot, _CLAIM), ir.Constant(I32, 0), ir.Constant(I32, 2), "acq_rel",
                               "acquire")
            with bb.if_then(bb.extract_value(taken, 1)):
                bb.store(ir.Constant(I8, 2), state_of(bb, w))
                run_here(bb, w)

    def join(bb: ir.IRBuilder, w: ir.Value, slot: ir.Value) -> None:
        h, wait, dn = (bb.append_basic_block(f"join.{x}") for x in ("check", "wait", "done"))
        running = bb.icmp_unsigned("==", bb.load(state_of(bb, w), typ=I8), ir.Constant(I8, 1))
        gen = bb.load(field(bb, slot, _GEN), typ=I32)
        bb.cbranch(running, h, dn)
        bb.position_at_end(h)
        finished = bb.load_atomic(field(bb, slot, _DONE), "acquire", 4, typ=I32)
        bb.cbranch(bb.icmp_unsigned("==", finished, gen), dn, wait)
        bb.position_at_end(wait)
        relax(bb)
        bb.branch(h)
        bb.position_at_end(dn)

    each_worker(b, "post", post)
    b.call(chunk, [contexts])  # chunk 0 here,
    each_worker(b, "unposted", unposted)  # the chunks of workers still busy acknowledging an older job,
    serial(b, b.add(workers, one))  # any chunk beyond the workers,
    each_worker(b, "steal", steal)  # every posted chunk no worker has claimed yet,
    each_worker(b, "join", join)  # and wait for the ones workers run
    _store(b, ir.Constant(I32, 0), state["busy"], "release")
    b.ret_void()
    return fn
