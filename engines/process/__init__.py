"""One engine per accelerator in a process of its own, behind the same interface as an in-process runner.

The daemon's front (HTTP, Wyoming, the live route, the queue worker, book assembly, ingest) and every
engine's busy loop would otherwise share one interpreter and its lock: measured on an H100, the loop
thread lost most of its time to host work beside the queue worker and the book writers, and two
engines in one process ran a book only x1.12 faster than one.

- `proxy.EngineProcess` (front side): starts `python -m engines.process.child`, hands it the
  `EngineSpec`, and serves `submit(request, priority) -> StreamHandle`, `cancel`, `stats`,
  `clone_voice` like `EngineRunner`; restarts the process when it dies (its requests fail with
  `EngineUnavailable`, which the jobs worker puts back in the queue without counting an attempt).
- `child`: loads the runner (`engines.load`), captures its graphs, then relays requests in and
  audio out.
- `wire`: the messages. Control messages are small pickles; audio goes as raw float32 records, many
  chunks per message, never pickled.
"""
