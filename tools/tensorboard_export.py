#!/usr/bin/env python3
"""Write TensorBoard event files from an nlptrain run's metrics.jsonl.

    python3 tools/tensorboard_export.py RUN_DIR [--logdir DIR] [--follow]
    tensorboard --logdir RUN_DIR/tensorboard

Every numeric field of every record with a step becomes a scalar at that step, tagged
<split>/<field>: train/loss, train/lr, train/grad_norm, train/tokens_per_s, train/step_time_s, and
eval/loss, eval/perplexity, eval/accuracy, ... (whatever the task's evaluation reports). Records
without a step (run.mode = eval) are not curves and are skipped. Events are written with
TensorBoard's own writer (torch.utils.tensorboard.SummaryWriter).

Each start rewrites the log dir's event files (events.out.tfevents.* in --logdir, nothing else
there is touched) from the whole metrics.jsonl, so running it again never duplicates a step. A
resumed run (train.resume = true) appends the steps after its checkpoint again: the last record of
a step wins.

--follow keeps tailing metrics.jsonl of a running job (waiting for it to appear), so that
`tensorboard --logdir` shows the curves live; stop it with Ctrl-C / SIGTERM (or --idle-exit).
A line still being written is held back until its newline arrives. When the job resumes (a step at
or before one already written) or starts over (metrics.jsonl truncated or replaced), a new event
file begins with a purge at that step (SessionLog START), so TensorBoard drops the superseded
points instead of showing two values for a step.
"""
from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_metrics import METRICS_FILE, MetricsError, Tail, dedupe, metrics_path, scalars, split_of  # noqa: E402

TOOL = "tensorboard_export"


def note(msg: str) -> None:
    print(f"{TOOL}: {msg}", file=sys.stderr, flush=True)


class Exporter:
    def __init__(self, logdir: Path):
        self.logdir = logdir
        self.writer = None
        self.last: dict[str, int] = {}  # split -> highest step written
        self.count = 0

    def _open(self, purge_step=None):
        from torch.utils.tensorboard import SummaryWriter  # imported late: torch is slow to load
        if self.writer is not None:
            self.writer.close()
            time.sleep(0.01)  # event file names carry the time: keep the new one sorting after
        self.writer = SummaryWriter(log_dir=str(self.logdir), purge_step=purge_step)

    def start(self):
        self.logdir.mkdir(parents=True, exist_ok=True)
        for old in self.logdir.glob("events.out.tfevents.*"):
            old.unlink()
        self._open()

    def _add(self, split: str, step: int, values: dict[str, float]):
        for name, v in values.items():
            self.writer.add_scalar(f"{split}/{name}", v, global_step=step)
            self.count += 1
        self.last[split] = max(step, self.last.get(split, step))

    def write_all(self, recs):
        for split, steps in dedupe(recs).items():
            for step, values in steps.items():
                self._add(split, step, values)
        self.writer.flush()

    def write_incremental(self, recs):
        for r in recs:
            step = r.get("step")
            if step is None:
                continue
            split = split_of(r)
            if split in self.last and step <= self.last[split]:
                note(f"{split} step {step} again (resumed run): TensorBoard drops the points "
                     f"from step {step} on")
                self._open(purge_step=step)
                self.last = {s: min(v, step - 1) for s, v in self.last.items()}
            self._add(split, step, scalars(r))
        self.writer.flush()

    def restart(self, recs):
        first = min((r["step"] for r in recs if r.get("step") is not None), default=0)
        note(f"metrics.jsonl was replaced (a new run): TensorBoard drops the points from step {first} on")
        self._open(purge_step=first)
        self.last = {}
        self.write_all(recs)

    def close(self):
        if self.writer is not None:
            self.writer.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="tensorboard_export.py", description=__doc__.split("\n\n")[0],
        epilog="Example: python3 tools/tensorboard_export.py out/ --follow &  "
               "tensorboard --logdir out/tensorboard",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", metavar="RUN_DIR",
                    help=f"nlptrain output.dir holding {METRICS_FILE} (or the path of a .jsonl file)")
    ap.add_argument("--logdir", type=Path,
                    help="where the event files go (default: RUN_DIR/tensorboard); its old "
                         "events.out.tfevents.* files are replaced")
    ap.add_argument("--follow", action="store_true",
                    help="keep tailing metrics.jsonl of a running job until interrupted")
    ap.add_argument("--interval", type=float, default=2.0, metavar="SECONDS",
                    help="--follow: how often to look for new lines (default 2)")
    ap.add_argument("--idle-exit", type=float, default=0.0, metavar="SECONDS",
                    help="--follow: stop once metrics.jsonl has not grown for this long (0 = never)")
    args = ap.parse_args(argv)

    run_dir = Path(args.run_dir)
    logdir = args.logdir or (run_dir.parent if run_dir.is_file() else run_dir) / "tensorboard"
    try:
        if not args.follow:
            path = metrics_path(run_dir)
            tail = Tail(path)
            recs = tail.read(final=True)
            if not any(r.get("step") is not None for r in recs):
                raise MetricsError(f"'{path}' holds no training or evaluation records with a step")
            ex = Exporter(logdir)
            ex.start()
            ex.write_all(recs)
            ex.close()
            note(f"{ex.count} scalars from '{path}' -> '{logdir}'")
            return 0
        return follow(run_dir, logdir, args.interval, args.idle_exit)
    except MetricsError as e:
        print(f"{TOOL}: error: {e}", file=sys.stderr)
        return 1


def follow(run_dir: Path, logdir: Path, interval: float, idle_exit: float) -> int:
    path = run_dir if run_dir.is_file() else run_dir / METRICS_FILE
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    ex = Exporter(logdir)
    ex.start()
    tail = Tail(path)
    if not path.is_file():
        note(f"waiting for '{path}'")
    note(f"following '{path}' -> '{logdir}' (Ctrl-C to stop)")
    last_change = time.monotonic()
    first = True
    try:
        while not stop:
            recs = tail.read()
            if recs or tail.restarted:
                last_change = time.monotonic()
                if first or not tail.restarted:
                    (ex.write_all if first else ex.write_incremental)(recs)
                else:
                    ex.restart(recs)
                first = False
            elif idle_exit > 0 and time.monotonic() - last_change > idle_exit:
                break
            for _ in range(max(1, int(interval / 0.05))):
                if stop:
                    break
                time.sleep(0.05)
    except KeyboardInterrupt:
        pass
    finally:
        # A job that ended without a final newline: its last line counts if complete JSON.
        ex.write_incremental(tail.read(final=True))
        ex.close()
        note(f"{ex.count} scalars written to '{logdir}'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
