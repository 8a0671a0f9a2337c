"""The suite's own set-up (tests/conftest.py): the node ids it names still exist."""

import os

import conftest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_files_scheduled_first_and_those_marked_slow_exist():
  """A renamed file would leave LONGEST_FIRST's ordering or SLOW_ELSEWHERE's marking silently."""
  named = list(conftest.LONGEST_FIRST) + [i.split("::")[0] for i in conftest.SLOW_ELSEWHERE]
  assert [p for p in named if not os.path.isfile(os.path.join(REPO, p))] == []
  assert len(set(conftest.LONGEST_FIRST)) == len(conftest.LONGEST_FIRST)


def test_the_longest_files_are_collected_first(request):
  """Collection order is xdist's loadfile order once its reordering is off (pytest_configure)."""
  paths = [item.nodeid.split("::")[0] for item in request.session.items]
  first = list(dict.fromkeys(paths))
  present = [p for p in conftest.LONGEST_FIRST if p in first]
  assert first[:len(present)] == present
  if hasattr(request.config.option, "loadscopereorder"):
    assert request.config.option.loadscopereorder is False
