"""What a run's process inherits from the local launcher before it starts: its cores, and
the launcher's niceness for its whole session.

Each run starts in a session of its own (so that a terminal's Ctrl-C reaches only the
launcher). On Linux with autogroups (`/proc/sys/kernel/sched_autogroup_enabled`, on by
default on desktop distributions) the scheduler first shares the CPU between sessions,
each weighted by its autogroup's nice value (0 for a new one), and only then between the
processes of a session by their own nice values. So `nice -n 19` on a launcher would leave
its runs competing with the user's shell as equals; the run's autogroup is given the
launcher's niceness too (man 7 sched, "The autogroup feature").
"""

import os

AUTOGROUP = "/proc/self/autogroup"


def enter_slot(cpus: tuple[int, ...]) -> None:
  """In the run's process, between fork and exec (`subprocess.Popen(preexec_fn=...)`)."""
  if cpus:
    os.sched_setaffinity(0, cpus)
  niceness = os.nice(0)
  if niceness > 0:
    try:
      with open(AUTOGROUP, "w") as f:
        f.write(str(niceness))
    except OSError:  # No autogroups, or a read-only /proc: the process's own nice stays.
      pass
