"""snapshot: the immutable picture of every environment and runner that all
passes and claims read, with the indexes kept beside it, and the pure
operations that make a new picture from an old one.

Nothing here reads Nomad or knows how job ids are spelt: the observer hands
in templates and runner views already derived, and gets a new `Snapshot`
back. Two indexes are kept so that nobody scans every runner:

- `by_env`: each environment's runners (a pass reads one environment);
- `ready`: each environment's ready, idle, known runners, oldest
  (CreateIndex) first, kept in order as runners change, so a claim takes
  the first one without sorting the pool.

The runners and their allocations are persistent maps (`immutables.Map`, a
hash array mapped trie): a new snapshot with a few runners changed shares
everything else with the old one. A claim's write and a targeted refresh
each make a new snapshot, several a claim, so they must not copy every
runner (a dict of 10,000 took 40–60 µs); what is still copied is the ready
list of an environment a runner enters or leaves.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace

from immutables import Map

from controller.model import Allocation, Phase, RunnerView, Template


@dataclass(frozen=True)
class Snapshot:
    templates: Mapping[int, Template]
    runners: Map[str, RunnerView]
    allocs: Map[str, tuple[Allocation, ...]]  # runner job id → all its allocations
    jobs_index: int
    allocs_index: int
    covers: int  # every event up to this index happened before the lists were taken
    taken_at: float  # monotonic
    safe: bool = True  # no runner's spec was unreadable: deletions may be planned
    by_env: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    ready: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    # Environments whose template job is listed but whose spec could not be
    # read yet (Nomad without a leader): they exist, though not in `templates`.
    unread_templates: frozenset[int] = frozenset()

    def exists(self, env_id: int) -> bool:
        """The environment's template job is listed (read or not)."""
        return env_id in self.templates or env_id in self.unread_templates

    def env_ids(self) -> set[int]:
        return set(self.templates) | set(self.by_env)

    def views(self, env_id: int) -> tuple[RunnerView, ...]:
        return tuple(self.runners[r] for r in self.by_env.get(env_id, ()))

    def claimable(self, env_id: int) -> Iterator[RunnerView]:
        """The environment's ready idle runners, oldest first."""
        for runner_id in self.ready.get(env_id, ()):
            yield self.runners[runner_id]


EMPTY = Snapshot({}, Map(), Map(), 0, 0, 0, 0.0)


def is_claimable(view: RunnerView) -> bool:
    return view.phase is Phase.READY and view.known and not view.claimed


def _age(view: RunnerView) -> tuple[int, str]:
    return (view.job.create_index, view.id)


def index_by_env(runners: Mapping[str, RunnerView]) -> dict[int, tuple[str, ...]]:
    """`by_env` built from scratch."""
    out: dict[int, list[str]] = defaultdict(list)
    for view in runners.values():
        out[view.env_id].append(view.id)
    return {env: tuple(ids) for env, ids in out.items()}


def update_by_env(
    by_env: Mapping[int, tuple[str, ...]],
    added: Mapping[str, int],
    removed: Mapping[str, int],
) -> dict[int, tuple[str, ...]]:
    """`by_env` after the runners `added` appeared and the runners `removed`
    went away (runner id → environment id), in the order `index_by_env`
    gives: the remaining runners as they were, the new ones after them.
    Only the environments touched are walked, and only for removals."""
    out = dict(by_env)
    gone: dict[int, set[str]] = defaultdict(set)
    for runner_id, env_id in removed.items():
        gone[env_id].add(runner_id)
    for env_id, went in gone.items():
        out[env_id] = tuple(r for r in out.get(env_id, ()) if r not in went)
    new: dict[int, list[str]] = defaultdict(list)
    for runner_id, env_id in added.items():
        new[env_id].append(runner_id)
    for env_id, came in new.items():
        out[env_id] = out.get(env_id, ()) + tuple(came)
    return {env_id: ids for env_id, ids in out.items() if ids}


def index_ready(runners: Mapping[str, RunnerView]) -> dict[int, tuple[str, ...]]:
    """`ready` built from scratch."""
    out: dict[int, list[RunnerView]] = defaultdict(list)
    for view in runners.values():
        if is_claimable(view):
            out[view.env_id].append(view)
    return {env: tuple(v.id for v in sorted(views, key=_age)) for env, views in out.items()}


def update_ready(
    ready: Mapping[int, tuple[str, ...]],
    before: Mapping[str, RunnerView],
    after: Mapping[str, RunnerView],
    changed: Mapping[str, int],
) -> dict[int, tuple[str, ...]]:
    """`ready` after the runners `changed` (runner id → environment id)
    changed, appeared or went away; `before` and `after` are the runners
    then and now. Only runners that stop or start being claimable (or change
    age) move, each at the place bisection finds, not a scan: most changes
    (a claimed or starting runner read again) leave the list as it is."""
    leaving: dict[int, list[RunnerView]] = defaultdict(list)
    entering: dict[int, list[RunnerView]] = defaultdict(list)
    for runner_id in changed:
        # Each as a claimable view, or None.
        old = view if (view := before.get(runner_id)) and is_claimable(view) else None
        new = view if (view := after.get(runner_id)) and is_claimable(view) else None
        if old is not None and new is not None and _age(old) == _age(new):
            continue
        if old is not None:
            leaving[old.env_id].append(old)
        if new is not None:
            entering[new.env_id].append(new)
    out = dict(ready)
    for env_id in leaving.keys() | entering.keys():
        current = list(out.get(env_id, ()))
        # Every runner listed was claimable before, so its age is in `before`;
        # once those leaving are out, every one left is in `after` as well.
        for gone in leaving.get(env_id, ()):
            at = bisect.bisect_left(current, _age(gone), key=lambda r: _age(before[r]))
            if at < len(current) and current[at] == gone.id:
                del current[at]
            elif gone.id in current:  # never left listed, whatever broke the order
                current.remove(gone.id)
        for came in entering.get(env_id, ()):
            bisect.insort(current, came.id, key=lambda r: _age(after[r]))
        if current:
            out[env_id] = tuple(current)
        else:
            out.pop(env_id, None)
    return out


def with_template(snap: Snapshot, template: Template) -> Snapshot:
    return replace(
        snap,
        templates={**snap.templates, template.env.id: template},
        unread_templates=snap.unread_templates - {template.env.id},
    )


def without_template(snap: Snapshot, env_id: int) -> Snapshot:
    if not snap.exists(env_id):
        return snap
    templates = dict(snap.templates)
    templates.pop(env_id, None)
    return replace(snap, templates=templates, unread_templates=snap.unread_templates - {env_id})


def with_runner(snap: Snapshot, view: RunnerView) -> Snapshot:
    """`view` in place of the runner's current one. A runner not in the
    snapshot is left out: a new one shows up with the next list."""
    if view.id not in snap.runners:
        return snap
    runners = snap.runners.set(view.id, view)
    return replace(
        snap,
        runners=runners,
        ready=update_ready(snap.ready, snap.runners, runners, {view.id: view.env_id}),
    )


def without_runner(snap: Snapshot, runner_id: str) -> Snapshot:
    view = snap.runners.get(runner_id)
    if view is None:
        return snap
    runners = snap.runners.delete(runner_id)
    by_env = update_by_env(snap.by_env, {}, {runner_id: view.env_id})
    ready = update_ready(snap.ready, snap.runners, runners, {runner_id: view.env_id})
    return replace(snap, runners=runners, by_env=by_env, ready=ready)


@dataclass(frozen=True)
class Read:
    """What one refresh read of some jobs: the templates and runner views
    derived from them, their allocations, and the jobs no longer listed."""

    templates: Mapping[int, Template]
    runners: Mapping[str, RunnerView]
    allocs: Mapping[str, tuple[Allocation, ...]]
    gone_templates: Iterable[int] = ()
    gone_runners: Iterable[str] = ()
    unread_templates: Iterable[int] = ()  # listed, spec not readable


def rebuilt(
    read: Read, *, jobs_index: int, allocs_index: int, covers: int, taken_at: float, safe: bool
) -> Snapshot:
    """A snapshot of exactly what a full refresh read (indexes built anew)."""
    return Snapshot(
        templates=dict(read.templates),
        runners=Map(read.runners),
        allocs=Map({j: a for j, a in read.allocs.items() if a}),
        jobs_index=jobs_index,
        allocs_index=allocs_index,
        covers=covers,
        taken_at=taken_at,
        safe=safe,
        by_env=index_by_env(read.runners),
        ready=index_ready(read.runners),
        unread_templates=frozenset(read.unread_templates) - read.templates.keys(),
    )


def merged(
    base: Snapshot,
    read: Read,
    *,
    jobs_index: int,
    allocs_index: int,
    covers: int,
    taken_at: float,
    safe: bool,
) -> Snapshot:
    """`base` with some jobs read again (a targeted refresh): their views and
    allocations replaced, the gone ones removed, the indexes updated only for
    them. The other runners are taken from `base` as they are."""
    templates = dict(base.templates)  # one per environment: small
    runners = base.runners.mutate()
    allocs = base.allocs.mutate()
    changed: dict[str, int] = {}
    added: dict[str, int] = {}
    removed: dict[str, int] = {}
    for env_id in read.gone_templates:
        templates.pop(env_id, None)
    for runner_id in read.gone_runners:
        old = runners.pop(runner_id, None)
        allocs.pop(runner_id, None)
        if old is not None:
            removed[runner_id] = changed[runner_id] = old.env_id
    templates.update(read.templates)
    for job_id, job_allocs in read.allocs.items():
        if job_allocs:
            allocs[job_id] = job_allocs
        else:
            allocs.pop(job_id, None)
    for runner_id, view in read.runners.items():
        if runner_id not in runners:  # new, or gone and back in one read (then last)
            added[runner_id] = view.env_id
        runners[runner_id] = view
        changed[runner_id] = view.env_id
    after = runners.finish()
    return Snapshot(
        templates=templates,
        runners=after,
        allocs=allocs.finish(),
        jobs_index=max(base.jobs_index, jobs_index),
        allocs_index=max(base.allocs_index, allocs_index),
        covers=covers,
        taken_at=taken_at,
        safe=safe,
        by_env=update_by_env(base.by_env, added, removed) if added or removed else base.by_env,
        ready=update_ready(base.ready, base.runners, after, changed),
        unread_templates=(
            (base.unread_templates | frozenset(read.unread_templates))
            - templates.keys()
            - frozenset(read.gone_templates)
        ),
    )
