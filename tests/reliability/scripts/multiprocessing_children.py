"""A profiled parent runs multiprocessing children mid-epoch; some children profile themselves.

    python multiprocessing_children.py PATH METHOD       METHOD: fork | spawn

Inside batch 1 of the parent's single epoch, two ``multiprocessing.Process``
children and a two-worker ``Pool`` run ``child_work``: the first Process
profiles itself (to PATH, like the parent), the second does not; the Pool
workers each profile themselves and are ended by ``pool.close(); join()``
(no ``ci.shutdown()`` of their own: the exit must flush them). Prints
``PID <parent>``, ``CHILDREN <json of pids>`` and ``DONE``.
"""

import json
import multiprocessing
import os
import sys

import cirron as ci


def child_work(path, profile, tag):
    if profile and not ci.health()["enabled"]:  # a Pool worker's second task: profiling
        ci.profile(path=path, flush_interval=30.0, frameworks=[])
    for i in ci.batches(range(3)):
        with ci.scope("child-work", index=i, tag=tag):
            ci.mark("child_loss", float(i))
    return os.getpid()


def pool_work(arguments):
    return child_work(*arguments)


def main():
    path, method = sys.argv[1], sys.argv[2]
    context = multiprocessing.get_context(method)
    ci.profile(path=path, flush_interval=30.0, frameworks=[])
    print(f"PID {os.getpid()}", flush=True)
    pids = {}
    for _epoch in ci.epochs(range(1)):
        for batch in ci.batches(range(3)):
            with ci.scope("parent-work", index=batch):
                ci.mark("loss", 1.0 / (batch + 1))
                if batch == 1:
                    profiled = context.Process(target=child_work, args=(path, True, "profiled"))
                    silent = context.Process(target=child_work, args=(path, False, "silent"))
                    for process in (profiled, silent):
                        process.start()
                    for process in (profiled, silent):
                        process.join(60)
                        assert process.exitcode == 0, process.exitcode
                    pids["profiled"], pids["silent"] = profiled.pid, silent.pid
                    with context.Pool(2) as pool:
                        pids["pool"] = sorted(
                            set(pool.map(pool_work, [(path, True, "pool")] * 4, chunksize=1))
                        )
                        pool.close()
                        pool.join()
    print(f"CHILDREN {json.dumps(pids)}", flush=True)
    ci.shutdown()
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
