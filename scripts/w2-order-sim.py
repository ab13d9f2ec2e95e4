#!/usr/bin/env python3
"""W2's load through orders of service, discrete-event simulated.

Separates what an order of service costs from what an implementation
costs: no runtime, no hand-offs, no clock reads, only the order. Two
servers, exponential service times (mean 500 us, so C = 4,000 req/s),
Poisson arrivals at W2's rates (high 0.3 C, normal 0.7 C, low 2 C), a
5 ms deadline from arrival, and the same early rejection for every order:
a request that waited past the deadline less a mean service is refused
when a server would take it. Non-preemptive: a started request runs to
the end, and finishing past its deadline makes it late, not good.

Orders (high is first and FIFO in every one):
  gate         per class oldest first until the oldest waited half the
               deadline, newest first from then on (examples/overload/gate.rs)
  epoch        normal and low LIFO-marked, epochs of a fifth of the
               deadline closing a twentieth of an epoch late: closed epochs
               newest first within a class; work of an open epoch only when
               nothing else waits (the queue's rule before 2026-12-07)
  epoch-prio   the same, but an open epoch goes ahead of lower classes'
               ready work (the rule since)
  lifo         newest first within a class
  fifo         oldest first

Prints, per seed and order: goodput (good completions over C times the
run), late completions per arrival, and each class's good completions
over C.

    python3 scripts/w2-order-sim.py [seeds]
"""

import bisect
import heapq
import math
import random
import sys

SERVERS = 2
MEAN = 0.0005
C = SERVERS / MEAN
SLO = 0.005
SECONDS = 10.0
RATES = (0.3 * C, 0.7 * C, 2.0 * C)
ORDERS = ("gate", "epoch", "epoch-prio", "lifo", "fifo")


def plan(seed):
    rnd = random.Random(seed)
    requests = []
    for cls, rate in enumerate(RATES):
        t = 0.0
        while True:
            t += rnd.expovariate(rate)
            if t > SECONDS:
                break
            requests.append((t, cls, rnd.expovariate(1 / MEAN)))
    requests.sort()
    return requests


def simulate(requests, order):
    epoch = SLO / 5
    delta = epoch / 20
    latest_start = SLO - MEAN
    # Per class, arrival times in arrival order (create time = arrival).
    waiting = [[], [], []]
    ids = [[], [], []]
    busy = []
    good = [0, 0, 0]
    late = 0
    nxt = 0
    now = 0.0

    def take(cls, at):
        ids[cls].pop(at)
        return cls, waiting[cls].pop(at)

    def closed_prefix(cls):
        # Epoch e closes at (e + 1) * epoch + delta: work created before
        # the start of the newest closed epoch's successor is ready.
        if now < epoch + delta:
            return 0
        last_closed = math.floor((now - delta) / epoch) - 1
        boundary = (last_closed + 1) * epoch
        return bisect.bisect_left(waiting[cls], boundary)

    def pick():
        for cls in range(3):
            # The hopeless are refused: a prefix, since arrivals are in order.
            cut = bisect.bisect_left(waiting[cls], now - latest_start)
            del waiting[cls][:cut]
            del ids[cls][:cut]
        if waiting[0]:
            return take(0, 0)
        if order == "gate":
            for cls in (1, 2):
                if waiting[cls]:
                    lifo = now - waiting[cls][0] > SLO / 2
                    return take(cls, -1 if lifo else 0)
            return None
        if order in ("lifo", "fifo"):
            for cls in (1, 2):
                if waiting[cls]:
                    return take(cls, -1 if order == "lifo" else 0)
            return None
        for cls in (1, 2):
            ready = closed_prefix(cls)
            if ready:
                return take(cls, ready - 1)
            if order == "epoch-prio" and waiting[cls]:
                return take(cls, 0)
        for cls in (1, 2):
            if waiting[cls]:
                return take(cls, 0)
        return None

    while True:
        while nxt < len(requests) and requests[nxt][0] <= now:
            t, cls, _ = requests[nxt]
            waiting[cls].append(t)
            ids[cls].append(nxt)
            nxt += 1
        while busy and busy[0] <= now:
            heapq.heappop(busy)
        while len(busy) < SERVERS:
            picked = pick()
            if picked is None:
                break
            cls, arrived = picked
            # The service time of the request picked: found by arrival time.
            index = bisect.bisect_left(requests, (arrived,))
            finish = now + requests[index][2]
            heapq.heappush(busy, finish)
            if finish - arrived <= SLO:
                good[cls] += 1
            else:
                late += 1
        events = []
        if nxt < len(requests):
            events.append(requests[nxt][0])
        if busy and any(waiting):
            events.append(busy[0])
        if not events:
            break
        now = min(events)
    total = C * requests[-1][0]
    return sum(good) / total, late / len(requests), [g / total for g in good]


def main():
    seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    print("seed  " + "  ".join(f"{o:>28}" for o in ORDERS))
    for seed in range(seeds):
        requests = plan(seed)
        cells = []
        for order in ORDERS:
            goodput, late, by_class = simulate(requests, order)
            cells.append(
                f"{100 * goodput:5.1f}% late {100 * late:4.2f}% "
                f"n {100 * by_class[1]:4.1f} l {100 * by_class[2]:4.1f}"
            )
        print(f"{seed:4}  " + "  ".join(f"{c:>28}" for c in cells))


if __name__ == "__main__":
    main()
