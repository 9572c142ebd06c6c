"""Nomad's event broker: turns each committed state transaction into one
`{"Index":N,"Events":[...]}` frame, keeps the last frames in a ring buffer so
subscribers can resume from an index, and fans frames out to subscribers.

As in Nomad (`nomad/state/events.go`), every event of a transaction carries
the event type of the transaction's message type, whatever table it touched:
a job registration's evaluation is an `Evaluation` event of type
`JobRegistered`."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nomadsim.encode import evaluation, node_full
from nomadsim.records import Alloc, Eval, JobRecord, JsonDict, Node
from nomadsim.state import ALLOCS, EVALS, JOBS, NODES, Commit


class _Deferred:
    """An event payload not encoded yet. Records are immutable, so encoding
    it when a subscriber first needs it gives exactly what encoding it at
    commit time would: a frame that leaves the ring buffer unread (no
    subscriber, none resuming from it) is never encoded at all."""

    __slots__ = ("encode",)

    def __init__(self, encode: Callable[[], JsonDict]) -> None:
        self.encode = encode


def _materialize(frame: JsonDict) -> JsonDict:
    for event in frame["Events"]:
        payload = event["Payload"]
        if isinstance(payload, _Deferred):
            event["Payload"] = payload.encode()
    return frame


# Message types of state transactions, and the event type each produces.
MSG_EVENT_TYPES = {
    "JobRegister": "JobRegistered",
    "JobDeregister": "JobDeregistered",
    "EvalUpdate": "EvaluationUpdated",
    "ApplyPlanResults": "PlanResult",
    "AllocClientUpdate": "AllocationUpdated",
    "AllocUpdateDesiredTransition": "AllocationUpdateDesiredStatus",
    "NodeRegister": "NodeRegistration",
    "NodeUpdateStatus": "NodeEvent",
    "NodeUpdateDrain": "NodeDrain",
    "NodeUpdateEligibility": "NodeEligibility",
}

TOPICS = ("Job", "Allocation", "Evaluation", "Node", "Deployment", "Service", "ACLToken")


@dataclass(frozen=True)
class Subscription:
    topics: dict[str, frozenset[str]]  # topic ("*" = all) -> keys ("*" = all)
    namespace: str  # "*" = all

    def matches(self, event: JsonDict) -> bool:
        keys = self.topics.get(event["Topic"]) or self.topics.get("*")
        if keys is None:
            return False
        ns = event["Namespace"]
        if self.namespace != "*" and ns not in ("", self.namespace):
            return False
        if "*" in keys:
            return True
        return event["Key"] in keys or any(k in keys for k in event["FilterKeys"] or ())


class Subscriber:
    def __init__(self, sub: Subscription) -> None:
        self.sub = sub
        self.queue: asyncio.Queue[JsonDict | None] = asyncio.Queue()

    def offer(self, frame: JsonDict) -> None:
        events = [e for e in frame["Events"] if self.sub.matches(e)]
        if events:
            self.queue.put_nowait({"Index": frame["Index"], "Events": events})


class EventBroker:
    def __init__(self, encode_alloc: Callable[[Alloc], JsonDict], buffer_size: int = 100) -> None:
        self._encode_alloc = encode_alloc
        self._buffer: deque[JsonDict] = deque(maxlen=buffer_size)
        self._subscribers: set[Subscriber] = set()
        self.published = 0
        # Set once the simulator stops: from then on no subscription stays open.
        self.closed = False

    def on_commit(self, commit: Commit) -> None:
        event_type = MSG_EVENT_TYPES.get(commit.msg_type)
        if event_type is None:
            return
        events = []
        for change in commit.changes:
            event = self._event(change.table, change.before, change.after, event_type)
            if event is not None:
                event["Index"] = commit.index
                events.append(event)
        if not events:
            return
        frame = {"Index": commit.index, "Events": events}
        self._buffer.append(frame)
        self.published += 1
        if self._subscribers:
            _materialize(frame)
        for subscriber in self._subscribers:
            subscriber.offer(frame)

    def _event(self, table: str, before: Any, after: Any, event_type: str) -> JsonDict | None:
        obj = after if after is not None else before
        if table == JOBS:
            assert isinstance(obj, JobRecord)
            return _envelope("Job", event_type, obj.id, obj.namespace, None, {"Job": obj.spec})
        if table == ALLOCS:
            if after is None:
                # A purge removes allocations without any allocation event.
                return None
            assert isinstance(obj, Alloc)
            alloc, encode_alloc = obj, self._encode_alloc

            def alloc_payload() -> JsonDict:
                payload = encode_alloc(alloc)
                payload.pop("Job", None)  # Nomad strips the job to keep events small
                return {"Allocation": payload}

            return _envelope(
                "Allocation",
                event_type,
                obj.id,
                obj.namespace,
                [obj.job_id, ""],
                _Deferred(alloc_payload),
            )
        if table == EVALS:
            assert isinstance(obj, Eval)
            ev = obj
            return _envelope(
                "Evaluation",
                event_type,
                obj.id,
                obj.namespace,
                [obj.job_id, ""],
                _Deferred(lambda: {"Evaluation": evaluation(ev)}),
            )
        if table == NODES:
            assert isinstance(obj, Node)
            node = obj
            return _envelope(
                "Node", event_type, obj.id, "", None, _Deferred(lambda: {"Node": node_full(node)})
            )
        return None

    def subscribe(self, sub: Subscription, from_index: int) -> Subscriber:
        """Register a subscriber and queue every buffered frame with Index >= from_index.

        As in Nomad's event buffer: index 0 replays the whole buffer, an index
        older than the buffer silently starts at the oldest frame, and one newer
        than every frame delivers the newest frame again.

        Once the broker is closed (the simulator is stopping) the subscriber
        gets only the end of its stream, so a client reconnecting while the
        server shuts down gets an answer that ends at once."""
        subscriber = Subscriber(sub)
        if self.closed:
            subscriber.queue.put_nowait(None)
            return subscriber
        frames = [f for f in self._buffer if f["Index"] >= from_index]
        if not frames and self._buffer:
            frames = [self._buffer[-1]]
        for frame in frames:
            subscriber.offer(_materialize(frame))
        self._subscribers.add(subscriber)
        return subscriber

    def unsubscribe(self, subscriber: Subscriber) -> None:
        self._subscribers.discard(subscriber)

    def close_all(self) -> None:
        """End every open stream and every later one (shutdown)."""
        self.closed = True
        for subscriber in self._subscribers:
            subscriber.queue.put_nowait(None)
        self._subscribers.clear()

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)


def _envelope(
    topic: str,
    event_type: str,
    key: str,
    namespace: str,
    filter_keys: list[str] | None,
    payload: JsonDict | _Deferred,
) -> JsonDict:
    return {
        "Topic": topic,
        "Type": event_type,
        "Key": key,
        "Namespace": namespace,
        "FilterKeys": filter_keys,
        "Index": 0,
        "Payload": payload,
    }


def parse_topics(values: list[str]) -> dict[str, frozenset[str]]:
    """`topic=Topic[:Key]`, repeatable; no topic parameter means every topic.

    As Nomad's `parseTopic` (command/agent/event_endpoint.go): the value is
    split at every colon; one part is a topic with every key, two parts are
    topic and key, taken as they are (an empty topic matches nothing, an
    empty key only an empty Key or FilterKey), more parts are an error.
    Raises ValueError with Nomad's message for that."""
    if not values:
        return {"*": frozenset({"*"})}
    topics: dict[str, set[str]] = {}
    for value in values:
        parts = value.split(":")
        if len(parts) > 2:
            raise ValueError(f"Invalid key value pair for topic, topic: {value}")
        topic, key = parts if len(parts) == 2 else (value, "*")
        topics.setdefault(topic, set()).add(key)
    return {t: frozenset(k) for t, k in topics.items()}
