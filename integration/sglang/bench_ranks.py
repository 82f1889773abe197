"""What tensor parallelism adds to a scheduling round: rank 0's plan broadcast to the
other ranks (:mod:`topas_sglang.ranks`), over a real gloo group between processes on
this machine, with SGLang's ``broadcast_pyobj``, as ``Controller.agree`` sends it.

Each round rank 0 sends a :class:`~topas_sglang.ranks.Word` for ``N`` waiting requests
(rids as ``topas serve-bench`` names them, a tenth of them held, 8 prompt ranks) and the
others apply it to their own queue; the figure is rank 1's wall time per round, the
receive and the reordering together (rank 0's send is cheaper).

    .venv-sglang/bin/python integration/sglang/bench_ranks.py [--waiting 20,100,400]
        [--ranks 2] [--rounds 500]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time


class _Req:
    def __init__(self, rid: str) -> None:
        self.rid = rid


def _rank(rank: int, size: int, workdir: str, waiting: list[int], rounds: int, out) -> None:  # type: ignore[no-untyped-def]
    import torch.distributed as dist

    from topas_sglang.ranks import apply_order, group_link, word

    dist.init_process_group("gloo", init_method=f"file://{workdir}/rendezvous",
                            rank=rank, world_size=size)  # fmt: skip
    link = group_link(dist.group.WORLD, rank, list(range(size)))
    for n in waiting:
        queue = [_Req(f"task{i:05d}/stage{i % 7}") for i in range(n)]
        order = queue[::-1]
        held = frozenset(r.rid for r in queue[::10])
        ranks = {1000 + a: (2, a) for a in range(8)}
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            if link.leads:
                link.share(word(order, held, ranks))
            else:
                apply_order(queue, link.share(None))
            times.append(time.perf_counter() - start)
        if rank == 1:
            out.put((n, 1e3 * statistics.median(times), 1e3 * sorted(times)[int(0.99 * rounds)]))
    dist.destroy_process_group()


def main() -> None:
    import multiprocessing

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--waiting", default="20,100,400")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=500)
    args = ap.parse_args()
    waiting = [int(x) for x in args.waiting.split(",")]
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as workdir:
        procs = [ctx.Process(target=_rank, args=(r, args.ranks, workdir, waiting, args.rounds, out))
                 for r in range(args.ranks)]  # fmt: skip
        for p in procs:
            p.start()
        rows = [out.get(timeout=600) for _ in waiting]
        for p in procs:
            p.join()
    print(f"{args.ranks} ranks, {args.rounds} rounds each; rank 1's wall time per round")
    print("| waiting | p50 (ms) | p99 (ms) |\n|---|---|---|")
    for n, p50, p99 in rows:
        print(f"| {n} | {p50:.3f} | {p99:.3f} |")


if __name__ == "__main__":
    main()
