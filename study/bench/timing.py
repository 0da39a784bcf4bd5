"""Step timing: real Lightning training steps of each variant, interleaved so that drift hits all alike."""

from __future__ import annotations

import atexit
import functools
import gc
import os
import shutil
import statistics
import tempfile
import threading
import traceback
from collections.abc import Callable
from pathlib import Path

import lightning as L
import torch

from study.bench.shapes import Settings, Shape, Variant
from study.callbacks.steptime import StepTimer


class Baton:
    """Round-robin turns between threads: exactly one variant's steps run at any time."""

    def __init__(self, names: list[str], on_pass: Callable[[str], None] | None = None) -> None:
        self.order = list(names)
        self.on_pass = on_pass  # called with the variant's name each time one of its chunks ends
        self.arrived: set[str] = set()
        self.turn: int | None = None  # None until every thread is ready (set-up never overlaps timed steps)
        self.cv = threading.Condition()

    def _current(self) -> str | None:
        return None if self.turn is None or not self.order else self.order[self.turn]

    def wait(self, name: str) -> None:
        with self.cv:
            self.arrived.add(name)
            if self.turn is None and self.arrived >= set(self.order):
                self.turn = 0
                self.cv.notify_all()
            self.cv.wait_for(lambda: self._current() == name)

    def pass_on(self, name: str, done: bool = False) -> None:
        with self.cv:
            if name not in self.order:
                return
            i = self.order.index(name)
            if self.on_pass is not None:
                self.on_pass(name)
            if done:
                self.order.pop(i)
                self.arrived.discard(name)
                if self.turn is not None:
                    self.turn = i % len(self.order) if self.order else 0
                if self.turn is None and self.order and self.arrived >= set(self.order):
                    self.turn = 0
            elif self.turn is not None:
                self.turn = (i + 1) % len(self.order)
            self.cv.notify_all()


def _step_timer(name: str, baton: Baton | None, warmup: int, chunk: int) -> StepTimer:
    """A step timer that, with a baton, waits for the variant's turn before a step (never timed) and passes the
    turn on after the warm-up steps and then after every ``chunk`` steps."""
    if baton is None:
        return StepTimer()
    count = 0

    def take_turn(trainer: L.Trainer) -> None:
        nonlocal count
        if count == 0:
            baton.wait(name)
        elif count >= warmup and (count - warmup) % chunk == 0:
            baton.pass_on(name)
            baton.wait(name)
        count += 1

    return StepTimer(take_turn)


def _flag_logging(records: list[tuple[float, int]], monitor_every: int | None) -> list[tuple[float, bool]]:
    """(seconds, global step) -> (seconds, whether the monitors logged on that step)."""
    return [(seconds, monitor_every is not None and step % monitor_every == 0) for seconds, step in records]


def build_module(shape: Shape, variant: Variant, seed: int = 0):
    """The `CausalLMModule` of ``variant`` at ``shape``, seeded: every pass of the bench builds its model here."""
    from study.attention import AttentionSpec
    from study.model import CausalLMModule

    torch.manual_seed(seed)
    common = dict(vocab_size=shape.vocab_size, block_size=shape.seq_len, warmup_steps=1)
    if shape.arch == "llama":
        # Through the real loading path (`from_pretrained` of a saved folder, then train mode).
        module = CausalLMModule(AttentionSpec(**variant.spec), model_name_or_path=str(llama_folder(shape)), **common)
    elif shape.arch == "gpt2":
        module = CausalLMModule(AttentionSpec(**variant.spec), n_layer=shape.n_layer, n_head=shape.n_head,
                                n_embd=shape.n_embd, n_positions=max(shape.seq_len, 64), **common)
    else:
        raise ValueError(f"shape {shape.name!r}: unknown arch {shape.arch!r} (gpt2 or llama)")
    if variant.implementation != "study":
        module.model.set_attn_implementation(variant.implementation)
    return module


@functools.cache
def llama_folder(shape: Shape) -> Path:
    """A randomly initialised Llama of ``shape`` saved once per process (removed at exit)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=shape.vocab_size, hidden_size=shape.n_embd, intermediate_size=shape.n_inner or 4 * shape.n_embd,
        num_hidden_layers=shape.n_layer, num_attention_heads=shape.n_head,
        num_key_value_heads=shape.n_kv_head or shape.n_head, max_position_embeddings=max(shape.seq_len, 64),
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    folder = Path(tempfile.mkdtemp(prefix=f"study-bench-{shape.name}-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def random_loader(shape: Shape, steps: int, seed: int = 0):
    """``steps`` batches of random token blocks of ``shape`` (the bench times steps, not data)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(shape.vocab_size, (steps * shape.batch_size, shape.seq_len), generator=gen)
    data = [{"input_ids": row} for row in ids]
    return torch.utils.data.DataLoader(data, batch_size=shape.batch_size, shuffle=False)


def bench_trainer(settings: Settings, steps: int, callbacks: list, log_dir: str):
    """A quiet Trainer of ``steps`` steps with ``callbacks``, as every pass of the bench runs them."""
    import lightning as L
    from lightning.pytorch.loggers import TensorBoardLogger

    accelerator = "gpu" if settings.device.startswith("cuda") else "cpu"
    return L.Trainer(
        accelerator=accelerator, devices=1, precision=settings.precision, max_steps=steps, max_epochs=-1,
        logger=TensorBoardLogger(log_dir, name="bench", version=0), enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, gradient_clip_val=1.0, num_sanity_val_steps=0,
        limit_val_batches=0, callbacks=callbacks,
    )


def chosen_monitors(classes: list[type], every: int | None, only: tuple[str, ...] = ()) -> list[type]:
    """The monitor classes a variant runs: those named in ``only`` (every one if empty); none for ``every=None``."""
    return [] if every is None else [cls for cls in classes if not only or cls.__name__ in only]


def monitor_callbacks(classes: list[type], every: int | None, only: tuple[str, ...] = ()) -> list:
    """One of each of `chosen_monitors`, logging every ``every`` steps."""
    return [cls(every_n_steps=every) for cls in chosen_monitors(classes, every, only)]


def time_variants(shape: Shape, vs: list[Variant], settings: Settings, classes: list[type], log_root: str,
                  tick: Callable[[str], None] | None = None) -> dict:
    """Interleaved Lightning fits, one thread per variant; returns per-variant step records (seconds, logging).

    ``tick`` is called once per round (every variant has run its chunk: the warm-up, then ``rounds`` of them)."""
    steps = settings.warmup + settings.rounds * settings.chunk
    chunks = 0

    def on_pass(name: str) -> None:
        nonlocal chunks
        chunks += 1
        if tick is not None and chunks % len(vs) == 0:
            done = chunks // len(vs)
            tick("warm-up" if done == 1 else str(done - 1))

    baton = Baton([v.name for v in vs], on_pass)
    records: dict[str, list] = {v.name: [] for v in vs}
    errors: dict[str, str] = {}

    def run(variant: Variant) -> None:
        try:
            module = build_module(shape, variant)
            timer = _step_timer(variant.name, baton, settings.warmup, settings.chunk)
            log_dir = os.path.join(log_root, f"{shape.name}-{len(records)}-{abs(hash(variant.name))}")
            trainer = bench_trainer(settings, steps, timer.around(monitor_callbacks(classes, variant.monitor_every, variant.monitors)), log_dir)
            try:
                trainer.fit(module, train_dataloaders=random_loader(shape, steps))
            finally:
                records[variant.name] = _flag_logging(timer.records, variant.monitor_every)
        except BaseException:  # a failing variant must not hang the others
            errors[variant.name] = traceback.format_exc(limit=4)
        finally:
            baton.pass_on(variant.name, done=True)

    # The first chunk is the warm-up: the baton rotates after `warmup` steps, then every `chunk`.
    threads = [threading.Thread(target=run, args=(v,), name=f"bench-{v.name}") for v in vs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"records": records, "errors": errors}


def time_one_at_a_time(shape: Shape, vs: list[Variant], settings: Settings, classes: list[type],
                        log_root: str, tick: Callable[[str], None] | None = None) -> dict:
    """For shapes too large to hold every variant at once: each round, every variant in turn runs one short fit
    (``warmup`` untimed + ``chunk`` timed steps), so drift still hits every variant alike, one model in memory.
    ``tick`` is called after each variant's fit (rounds x variants times)."""
    records: dict[str, list] = {v.name: [] for v in vs}
    errors: dict[str, str] = {}
    for round_index in range(settings.rounds):
        for variant in vs:
            if variant.name in errors:
                continue
            timer = StepTimer()
            try:
                module = build_module(shape, variant)
                log_dir = os.path.join(log_root, f"{shape.name}-{round_index}-{abs(hash(variant.name))}")
                trainer = bench_trainer(settings, settings.warmup + settings.chunk,
                                   timer.around(monitor_callbacks(classes, variant.monitor_every, variant.monitors)), log_dir)
                trainer.fit(module, train_dataloaders=random_loader(shape, settings.warmup + settings.chunk))
            except BaseException:  # reported per variant, the others go on
                errors[variant.name] = traceback.format_exc(limit=4)
            # Warm-up steps of every fit are dropped here; the caller's summary then drops none.
            records[variant.name] += _flag_logging(timer.records, variant.monitor_every)[settings.warmup:]
            del timer
            gc.collect()
            if tick is not None:
                tick(f"{variant.name}, round {round_index + 1}")
    return {"records": records, "errors": errors, "warmup_dropped": True}


def summarise_times(records: list, warmup: int, every: int | None, fallback_log: float | None) -> dict:
    timed = records[warmup:]
    if not timed:
        return {"step_s": None, "steps": 0}
    all_s = [t for t, _ in timed]
    out = {"steps": len(timed), "median_all_s": statistics.median(all_s)}
    if every is None or every == 1:
        out["step_s"] = out["median_all_s"]
        return out
    plain = [t for t, logging in timed if not logging]
    logged = [t for t, logging in timed if logging]
    log_s, source = (statistics.median(logged), "own") if logged else (fallback_log, "every-step variant")
    plain_s = statistics.median(plain) if plain else log_s
    out.update(non_logging_step_s=plain_s, logging_step_s=log_s, logging_step_source=source)
    out["step_s"] = None if log_s is None else ((every - 1) * plain_s + log_s) / every
    return out

