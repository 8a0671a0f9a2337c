"""What a run's process inherits from the launcher before it starts: on the local back
end its cores, and the launcher's niceness for its whole session; on a Ray node the
launcher's niceness for the process alone.

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


def at_least(niceness: int) -> None:
  """In a run's process on a Ray node, before exec: its nice value raised to the
  launcher's `niceness` (never lowered: Ray starts its workers at 15, its
  `worker_niceness`, and lowering takes privilege). The process stays in its Ray
  worker's session, so that Ray's clean-up of a dead worker reaches it; that session's
  autogroup is the node's, set by whoever ran `ray start` (`nice -n 19 ray start ...` for
  a node that should yield to interactive work)."""
  raise_by = niceness - os.nice(0)
  if raise_by > 0:
    os.nice(raise_by)
