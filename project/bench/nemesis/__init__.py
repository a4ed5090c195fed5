"""The nemesis runner (``manage.py nemesis``): many processes use one primitive while a
nemesis kills, stops, cuts and skews them, and a checker judges the history afterwards.

- ``client``: the client process (``python -m project.bench.nemesis.client``), one loop per
  primitive, writing its history (every trusted interval, wait, claim, save) to a file;
- ``faults``: the nemesis itself: SIGKILL, SIGSTOP/SIGCONT, server-side connection kills,
  server restarts, client wall clocks moved by libfaketime;
- ``checker``: the judge (overlaps beyond capacity, fences, items done twice, waiters never
  served, two leaders, barrier rounds);
- ``runner``: puts them together for one primitive on one database and returns the report.

docs/jepsen.md says how to run it and gives the figures.
"""
