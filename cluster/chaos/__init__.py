"""The chaos harness (`dledger chaos`): real node processes reached through TCP
fault proxies, a workload that records every operation, a nemesis that kills,
pauses and partitions nodes on a seeded schedule, and a checker that proves
from the final committed logs that nothing acknowledged was lost, duplicated,
reordered or diverged.

    proxy.py      LinkProxy: one directed peer link, with drop / delay per direction
    network.py    FaultNetwork: every link of the cluster; partitions in terms of nodes
    history.py    Operation, FaultWindow, History: what happened, with monotonic times
    workload.py   the log workload (concurrent appends of uniquely identified bodies)
    schedule.py   the seeded plan of faults (pure: same seed, same plan)
    nemesis.py    carries the plan out against processes and links
    checker.py    the safety checks over a history and the nodes' committed logs
    availability.py  unavailability windows and recovery time per fault
    plot.py       the timeline PNG
    runner.py     one whole run: start, load, faults, heal, converge, check, write
    command.py    the `dledger chaos` arguments and exit code
"""
