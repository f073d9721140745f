"""Deterministic simulation of the group coordinator (docs/simulation.md).

The production runtime, shards, purgatories, timing wheel, handlers and the Kafka store's write path run
unmodified in one thread on a virtual clock, over a simulated Kafka, driven by simulated consumers and seeded
faults; invariants are checked as the run goes and at its end. One seed fixes everything: time, the order of
simultaneous timers, latencies, Kafka's answers, member ids, faults — the same seed replays the same history
(same hash).

Layout:
  loop.py        VirtualLoop: asyncio's BaseEventLoop on virtual time, seeded order of simultaneous timers
  kafka.py       SimKafka (per-partition logs of (key, value) records, outages, compaction) and SimProducer
                 (Kafka's acknowledgement rules: acked, refused, failed after append, timed out, lost in a crash)
  ledger.py      what the store was told about each write: the reference the checkers judge against
  store.py       SimulatedStore: the production KafkaGroupStore on SimProducer, loading by replaying the log
  instance.py    one coordinator process (assembled as app.py does), its crash and restart; the network
  clients.py     simulated classic consumers (Java client behaviour), range assignor
  invariants.py  the checkers
  history.py     the event list, its hash, the trace
  run.py         scenario from a seed, the run, faults, the outcome
  plants.py      planted bugs: mutations of production code the simulator must find
  __main__.py    the command: python -m simulator --seeds N [--start S] [--seed S --trace]
"""
