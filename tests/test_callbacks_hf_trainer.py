"""The monitors under a real `transformers.Trainer` (`study.callbacks.hf_trainer`): the same tags, steps and values
as the Lightning path logs on the same weights and batches."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from study.attention import AttentionSpec, apply_attention_spec
from study.callbacks import (
    AttentionEntropyMonitor,
    AttentionJacobianMonitor,
    AttentionMapMonitor,
    GradientNormMonitor,
    NormalizerParameterMonitor,
    SelectionUniformityMonitor,
    TensorBoardLayout,
)
from study.callbacks.hf_trainer import TrainerMonitors
from tests.callback_helpers import make_trainer, scalars

SPEC = AttentionSpec(temperature=0.5, top_k=4)
LR = 0.05
BATCH, LENGTH, VOCAB = 2, 12, 64


def tiny_gpt2(spec: AttentionSpec = SPEC) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=32,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # no dropout: both paths see one function
    return apply_attention_spec(GPT2LMHeadModel(config), spec)


class Samples(torch.utils.data.Dataset):
    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (n, LENGTH), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        # The Trainer divides the summed loss by the labels it counts (num_items_in_batch), before the model's
        # shift: the first label, never predicted, set to -100 makes that the model's own mean over tokens.
        labels = self.ids[i].clone()
        labels[0] = -100
        return {"input_ids": self.ids[i], "labels": labels}


class TinyLightningGPT2(L.LightningModule):
    def __init__(self, spec: AttentionSpec = SPEC) -> None:
        super().__init__()
        self.model = tiny_gpt2(spec)

    def training_step(self, batch, batch_idx):
        return self.model(**batch).loss

    def validation_step(self, batch, batch_idx):
        return self.model(**batch).loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=LR)


def monitors() -> list:
    return [
        AttentionEntropyMonitor(every_n_steps=1, per_head=True),
        SelectionUniformityMonitor(every_n_steps=1, selection_ks=(1, 4)),
        AttentionJacobianMonitor(every_n_steps=2, rows=4),
        GradientNormMonitor(every_n_steps=1, by=("block", "kind", "block_kind")),
        NormalizerParameterMonitor(every_n_steps=1),  # SSMax's learnable s; nothing under softmax
        TensorBoardLayout(),
    ]


STEPS = 3


def lightning_run(root: Path, accumulate: int, spec: AttentionSpec = SPEC) -> dict[str, list[tuple[int, float]]]:
    train = torch.utils.data.DataLoader(Samples(BATCH * STEPS * accumulate, seed=1), batch_size=BATCH)
    val = torch.utils.data.DataLoader(Samples(2 * BATCH, seed=2), batch_size=BATCH)
    trainer = make_trainer(root, monitors(), max_steps=STEPS, accumulate_grad_batches=accumulate)
    trainer.fit(TinyLightningGPT2(spec), train, val)
    return scalars(root)


def hf_run(root: Path, accumulate: int, max_grad_norm: float = 0.0, spec: AttentionSpec = SPEC) -> tuple[dict, Trainer]:
    args = TrainingArguments(
        output_dir=str(root), report_to="tensorboard", use_cpu=True, max_steps=STEPS, learning_rate=LR,
        optim="sgd", lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=max_grad_norm,
        per_device_train_batch_size=BATCH, per_device_eval_batch_size=BATCH, gradient_accumulation_steps=accumulate,
        train_sampling_strategy="sequential", eval_strategy="steps", eval_steps=STEPS, save_strategy="no",
        logging_steps=1, disable_tqdm=True, dataloader_num_workers=0,
    )
    trainer = Trainer(model=tiny_gpt2(spec), args=args, train_dataset=Samples(BATCH * STEPS * accumulate, seed=1),
                      eval_dataset=Samples(2 * BATCH, seed=2))
    TrainerMonitors(monitors()).attach(trainer)
    trainer.train()
    (folder,) = (root / "runs").iterdir()
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
    acc.Reload()
    values = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    return {**values, "__histograms__": acc.Tags()["histograms"]}, trainer


@pytest.mark.slow
@pytest.mark.parametrize(("accumulate", "spec"), [(1, SPEC), (2, SPEC), (1, AttentionSpec(normalizer="ssmax"))],
                         ids=["T0.5-top4", "T0.5-top4-accumulate2", "ssmax"])
def test_trainer_logs_the_lightning_tags_and_values(tmp_path: Path, accumulate: int, spec: AttentionSpec) -> None:
    lightning = lightning_run(tmp_path / "lightning", accumulate, spec)
    hf, _ = hf_run(tmp_path / "hf", accumulate, spec=spec)
    histograms = hf.pop("__histograms__")
    ours = {tag for tag in lightning if tag != "epoch"}
    assert ours, "the Lightning path logged nothing"
    # the Trainer's own tags (train/loss, eval/loss, ...) come beside ours; ours are all there, nothing else added
    assert ours <= set(hf), sorted(ours - set(hf))
    assert {t for t in hf if not t.startswith(("train/", "eval/"))} == ours
    assert "attention/normalized_entropy/heads" in histograms and "val/attention/normalized_entropy/heads" in histograms
    assert (spec.normalizer == "ssmax") == ("normalizer/ssmax_s/layer_1" in ours)
    for tag in sorted(ours):
        steps_l = [s for s, _ in lightning[tag]]
        steps_h = [s for s, _ in hf[tag]]
        assert steps_h == steps_l, (tag, steps_h, steps_l)
        # kl_uniform = log n - H is a difference of two fp32 numbers near log n: near uniform rows (3.7e-5 here)
        # it carries their rounding, about 1e-7 absolute, which the two trainers' last-bit differences reach after
        # two updates on some CPUs (2.5e-9 seen on an AMD EPYC, under 1e-9 on an Intel Xeon); other tags keep 1e-9.
        near_zero = 1e-7 if "kl_uniform" in tag else 1e-9
        assert [v for _, v in hf[tag]] == pytest.approx([v for _, v in lightning[tag]], rel=1e-6, abs=near_zero), tag
    # every_n_steps is in optimizer steps: training tags at 0, 1, 2 (the Jacobian's every 2: 0, 2), whatever the
    # accumulation; validation once, after the last step
    assert [s for s, _ in hf["attention/entropy/mean"]] == [0, 1, 2]
    if spec.normalizer == "softmax":  # the Jacobian monitor measures softmax layers only
        assert [s for s, _ in hf["attention/jacobian/mean"]] == [0, 2]
    assert [s for s, _ in hf["val/attention/entropy/mean"]] == [STEPS]
    assert hf["grad_norm/total"][0][1] > 0


@pytest.mark.slow
def test_gradient_norms_are_measured_before_the_trainers_clipping(tmp_path: Path) -> None:
    """With max_grad_norm on, the Trainer clips before on_pre_optimizer_step; the adapter takes the clipping over,
    so grad_norm/total is the norm before clipping (the Trainer's own train/grad_norm) and total_clipped is min(
    total, max_grad_norm), and training follows the clipped gradients (the next step's values differ)."""
    clip = 0.05
    hf, trainer = hf_run(tmp_path / "clip", accumulate=1, max_grad_norm=clip)
    total = dict(hf["grad_norm/total"])
    clipped = dict(hf["grad_norm/total_clipped"])
    assert all(v > clip for v in total.values()), total  # the clip bites on every step
    assert clipped == pytest.approx({s: clip for s in total}, rel=1e-3)
    # the Trainer's own grad_norm log, after the step, is the pre-clip norm of that step's gradients
    hf_norm = dict(hf["train/grad_norm"])
    assert [hf_norm[s + 1] for s in sorted(total)] == pytest.approx([total[s] for s in sorted(total)], rel=1e-5)
    assert trainer.args.max_grad_norm == clip  # restored after the fit
    unclipped, _ = hf_run(tmp_path / "noclip", accumulate=1)
    assert unclipped["grad_norm/total"][0][1] == pytest.approx(total[0], rel=1e-5)  # same first step
    assert unclipped["grad_norm/total"][1][1] != pytest.approx(total[1], rel=1e-3)  # then the clip changed the path


def test_lightning_loop_callbacks_are_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="AttentionMapMonitor cannot run under transformers.Trainer: .*fit_loop"):
        TrainerMonitors([AttentionMapMonitor()])
    with pytest.raises(TypeError, match="Lightning callbacks"):
        TrainerMonitors([object()])


def test_every_hook_of_the_adapter_is_a_trainer_callback_event() -> None:
    """A misspelt event would never be called: every on_* method is one of TrainerCallback's."""
    from transformers import TrainerCallback

    hooks = {name for name in vars(TrainerMonitors) if name.startswith("on_")}
    assert hooks and hooks <= set(vars(TrainerCallback)), sorted(hooks - set(vars(TrainerCallback)))


@pytest.mark.slow
def test_evaluate_before_training_is_the_lightning_validation_at_step_0_and_predict_is_not_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No event comes before evaluation: the taps open from the model's eval forward. evaluate() alone logs
    val/ at step 0 with Lightning's validate() values; predict() between two evaluations adds nothing."""
    from study.attention import active_taps

    val = torch.utils.data.DataLoader(Samples(2 * BATCH, seed=2), batch_size=BATCH)
    lightning_trainer = make_trainer(tmp_path / "lightning", monitors())
    lightning_trainer.validate(TinyLightningGPT2(), val, verbose=False)
    lightning = scalars(tmp_path / "lightning")

    # Before train() the Trainer's TensorBoardCallback has no run folder of its own (it would write to ./runs)
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "hf" / "runs" / "eval"))
    args = TrainingArguments(output_dir=str(tmp_path / "hf"), report_to="tensorboard", use_cpu=True,
                             per_device_eval_batch_size=BATCH, disable_tqdm=True)
    trainer = Trainer(model=tiny_gpt2(), args=args, eval_dataset=Samples(2 * BATCH, seed=2))
    TrainerMonitors(monitors()).attach(trainer)
    trainer.evaluate()
    trainer.predict(Samples(BATCH, seed=3))  # not an evaluation: not tapped, nothing logged
    trainer.evaluate()
    assert not active_taps()
    (folder,) = (tmp_path / "hf" / "runs").iterdir()
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    hf = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    ours = {tag for tag in lightning if tag != "epoch"}
    assert "val/attention/jacobian/mean" in ours and ours == {t for t in hf if not t.startswith(("train/", "eval/"))}
    for tag in sorted(ours):
        (step, value), = lightning[tag]
        assert step == 0
        assert hf[tag] == [(0, pytest.approx(value, rel=1e-6, abs=1e-9))] * 2, tag  # both evaluations, equal


@pytest.mark.slow
def test_a_failed_training_step_leaves_no_tap_open(tmp_path: Path) -> None:
    """The Trainer has no exception event: the adapter's wrapped train() passes it to the monitors."""
    from study.attention import active_taps

    args = TrainingArguments(output_dir=str(tmp_path), report_to="tensorboard", use_cpu=True, max_steps=3,
                             per_device_train_batch_size=BATCH, save_strategy="no", disable_tqdm=True,
                             max_grad_norm=0.5)
    trainer = Trainer(model=tiny_gpt2(), args=args, train_dataset=Samples(BATCH * 3, seed=1))
    TrainerMonitors(monitors()).attach(trainer)

    def fail_at_step_1(module, inputs):
        assert active_taps(), "the taps are open during a logging step's forward"
        if trainer.state.global_step == 1:
            raise RuntimeError("planted failure")

    trainer.model.register_forward_pre_hook(fail_at_step_1)
    with pytest.raises(RuntimeError, match="planted failure"):
        trainer.train()
    assert not active_taps()
    assert trainer.args.max_grad_norm == 0.5  # the clipping the adapter took over is given back


def _evaluate_into(output: Path) -> None:
    """evaluate() of the tiny GPT-2 on four samples, in this process (or in each of torchrun's processes)."""
    import os

    # read when the Trainer builds its TensorBoardCallback; before train() it has no run folder of its own
    saved = os.environ.get("TENSORBOARD_LOGGING_DIR")
    os.environ["TENSORBOARD_LOGGING_DIR"] = str(output / "runs" / "eval")
    try:
        args = TrainingArguments(output_dir=str(output), report_to="tensorboard", use_cpu=True,
                                 per_device_eval_batch_size=1, disable_tqdm=True)
        trainer = Trainer(model=tiny_gpt2(), args=args, eval_dataset=Samples(4, seed=2))
    finally:
        if saved is None:
            del os.environ["TENSORBOARD_LOGGING_DIR"]
        else:
            os.environ["TENSORBOARD_LOGGING_DIR"] = saved
    TrainerMonitors([AttentionEntropyMonitor(per_head=True), SelectionUniformityMonitor(selection_ks=(1, 4))]).attach(
        trainer)
    trainer.evaluate()


def _logged(output: Path) -> dict[str, list[tuple[int, float]]]:
    folders = sorted((output / "runs").iterdir())
    assert len(folders) == 1, folders
    acc = EventAccumulator(str(folders[0]), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]
            if not tag.startswith(("train/", "eval/"))}


@pytest.mark.slow
def test_two_processes_reduce_to_the_single_process_values_and_write_once(tmp_path: Path) -> None:
    """Under torchrun (2 CPU processes, gloo) each rank evaluates two of the four samples; the sums reduced across
    the ranks give the single process's values over all four, written once (rank 0)."""
    import socket
    import subprocess
    import sys

    with socket.socket() as free:  # a port no other test's processes hold
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
         "-m", "tests.test_callbacks_hf_trainer", str(tmp_path / "ddp")],
        cwd=root, capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    _evaluate_into(tmp_path / "single")
    single, ddp = _logged(tmp_path / "single"), _logged(tmp_path / "ddp")
    assert single and set(ddp) == set(single)
    for tag, values in single.items():
        assert len(ddp[tag]) == 1, (tag, ddp[tag])  # once, not once per rank
        assert ddp[tag][0][1] == pytest.approx(values[0][1], rel=1e-5, abs=1e-7), tag


if __name__ == "__main__":  # a torchrun child of the test above
    import sys

    _evaluate_into(Path(sys.argv[1]))


def test_passed_in_callbacks_without_attach_is_refused_before_training(tmp_path: Path) -> None:
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True, max_steps=1,
                             per_device_train_batch_size=BATCH, save_strategy="no", disable_tqdm=True)
    trainer = Trainer(model=tiny_gpt2(), args=args, train_dataset=Samples(BATCH, seed=1),
                      callbacks=[TrainerMonitors([AttentionEntropyMonitor()], log_dir=str(tmp_path / "tb"))])
    with pytest.raises(RuntimeError, match=r"attached with \.attach\(trainer\)"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_without_a_tensorboard_callback_or_log_dir_attach_says_what_to_do(tmp_path: Path) -> None:
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=tiny_gpt2(), args=args)
    with pytest.raises(ValueError, match="report_to='tensorboard' or give TrainerMonitors\\(log_dir=...\\)"):
        TrainerMonitors([AttentionEntropyMonitor()]).attach(trainer)


@pytest.mark.slow
def test_without_report_to_tensorboard_the_tags_go_to_log_dir(tmp_path: Path) -> None:
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True, max_steps=2,
                             per_device_train_batch_size=BATCH, save_strategy="no", disable_tqdm=True)
    trainer = Trainer(model=tiny_gpt2(), args=args, train_dataset=Samples(2 * BATCH, seed=1))
    TrainerMonitors([AttentionEntropyMonitor(every_n_steps=1)], log_dir=str(tmp_path / "tb")).attach(trainer)
    trainer.train()
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("attention/entropy/mean")] == [0, 1]
    assert not (tmp_path / "out" / "runs").exists()


# ---- resuming from a checkpoint (issue 52, N10) ----------------------------------------------------------------
RESUMED_STEPS = 6
# The Trainer's wall-clock tags (eval/runtime, .../samples_per_second) differ between any two runs, and its mean loss
# of one train() call is the resumed call's own steps: their steps are compared, not their values
def _timed(tag: str) -> bool:
    return tag.endswith(("runtime", "_per_second")) or tag == "train/train_loss"



class Killed(Exception):
    """A planted interruption."""


def _checkpointing_trainer(output: Path, kill_at: int | None = None) -> Trainer:
    from transformers import TrainerCallback

    args = TrainingArguments(
        output_dir=str(output), report_to="tensorboard", use_cpu=True, max_steps=RESUMED_STEPS, learning_rate=LR,
        optim="sgd", lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=0.0,
        per_device_train_batch_size=BATCH, per_device_eval_batch_size=BATCH, train_sampling_strategy="sequential",
        eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2, logging_steps=1, disable_tqdm=True,
        dataloader_num_workers=0,
    )

    class KillAt(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == kill_at:
                raise Killed(f"killed at step {kill_at}")

    trainer = Trainer(model=tiny_gpt2(), args=args, train_dataset=Samples(BATCH * RESUMED_STEPS, seed=1),
                      eval_dataset=Samples(2 * BATCH, seed=2), callbacks=[KillAt()] if kill_at is not None else [])
    TrainerMonitors(monitors()).attach(trainer)
    return trainer


def _read_run(output: Path) -> tuple[dict[str, list[tuple[int, float]]], dict[str, list[int]]]:
    """Every scalar (step, value) and histogram step of the run's one TensorBoard folder, as TensorBoard reads it
    (purges applied, duplicates kept)."""
    (folder,) = (output / "runs").iterdir()
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    return ({tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]},
            {tag: [e.step for e in acc.Histograms(tag)] for tag in acc.Tags()["histograms"]})


@pytest.mark.slow
def test_a_fit_resumed_from_a_checkpoint_logs_the_uninterrupted_run_once_a_step(tmp_path: Path) -> None:
    """Killed after checkpoint-4 (its step-4 monitor values and step-5 loss already logged), resumed from the last
    checkpoint by a new Trainer: every tag, step and value is the uninterrupted run's, each step once; the
    Jacobian's row sampler continues from the checkpoint."""
    from transformers.integrations import TensorBoardCallback

    from study.callbacks.hf_trainer import STATE_FILE

    _checkpointing_trainer(tmp_path / "whole").train()
    whole, whole_histograms = _read_run(tmp_path / "whole")

    killed = _checkpointing_trainer(tmp_path / "resumed", kill_at=5)
    with pytest.raises(Killed):
        killed.train()
    for callback in killed.callback_handler.callbacks:  # what the process's end would do
        if isinstance(callback, TensorBoardCallback):
            callback.tb_writer.close()
    before, _ = _read_run(tmp_path / "resumed")
    assert 4 in dict(before["attention/entropy/mean"]) and 5 in dict(before["train/loss"])  # logged after the save
    assert (tmp_path / "resumed" / "checkpoint-4" / STATE_FILE).is_file()

    _checkpointing_trainer(tmp_path / "resumed").train(resume_from_checkpoint=True)
    resumed, resumed_histograms = _read_run(tmp_path / "resumed")
    assert len(list((tmp_path / "resumed" / "runs").iterdir())) == 1  # the interrupted fit's folder, written again
    assert "attention/jacobian/mean" in whole and "val/attention/entropy/mean" in whole
    assert set(resumed) == set(whole)
    for tag in sorted(whole):
        steps = [s for s, _ in resumed[tag]]
        assert steps == [s for s, _ in whole[tag]], tag  # no step added, none lost
        # each step once; the Trainer itself logs `epoch` twice at an evaluation step, in its training log and in
        # its evaluation's, in any run
        assert steps == sorted(set(steps)) or tag == "train/epoch", (tag, steps)
        if not _timed(tag):
                assert [v for _, v in resumed[tag]] == pytest.approx([v for _, v in whole[tag]], rel=1e-6, abs=1e-9), tag
    assert resumed_histograms == whole_histograms


def test_the_monitors_state_is_saved_in_the_checkpoint_and_restored_before_they_start(tmp_path: Path) -> None:
    """on_save writes each monitor's state_dict (the Jacobian's row sampler, the counters) into checkpoint-N, read
    back as data only; the resumed fit's monitors get it before on_fit_start, and other monitors are refused."""
    from transformers import TrainerControl, TrainerState

    from study.callbacks.hf_trainer import STATE_FILE

    class Stub:  # the Trainer attributes the adapter reads, without building one
        args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True, max_grad_norm=0.0)
        callback_handler = type("Handler", (), {"callbacks": []})()
        model = torch.nn.Linear(1, 1)
        state, control = TrainerState(), TrainerControl()

        def add_callback(self, callback):
            pass

        def train(self, resume_from_checkpoint=None):
            pass

        evaluate = train

        def is_world_process_zero(self):
            return True

    jacobian = AttentionJacobianMonitor(every_n_steps=2, rows=4, seed=3)
    jacobian._generator.manual_seed(11)
    torch.rand(5, generator=jacobian._generator)  # a sampler part way through the run
    jacobian.train_logs = 7
    adapter = TrainerMonitors([jacobian], log_dir=str(tmp_path / "tb")).attach(Stub())
    state = TrainerState(global_step=4)
    (tmp_path / "checkpoint-4").mkdir()
    state.save_to_json(str(tmp_path / "checkpoint-4" / "trainer_state.json"))
    adapter._batch_idx = 4
    adapter.on_save(Stub.args, state, TrainerControl())
    saved = torch.load(tmp_path / "checkpoint-4" / STATE_FILE, weights_only=True)
    assert saved["batch_idx"] == 4 and saved["log_dir"] == str(tmp_path / "tb")

    fresh = AttentionJacobianMonitor(every_n_steps=2, rows=4, seed=3)
    resumed = TrainerMonitors([fresh], log_dir=str(tmp_path / "tb")).attach(Stub())
    resumed.trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))
    resumed.on_train_begin(Stub.args, state, TrainerControl())
    assert fresh.train_logs == 7 and resumed._batch_idx == 4
    assert torch.equal(fresh._generator.get_state(), jacobian._generator.get_state())  # restored at on_fit_start
    assert torch.equal(torch.rand(3, generator=fresh._generator), torch.rand(3, generator=jacobian._generator))
    other = TrainerMonitors([AttentionEntropyMonitor()], log_dir=str(tmp_path / "tb")).attach(Stub())
    other.trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))
    with pytest.raises(ValueError, match="resume with the same monitors"):
        other.on_train_begin(Stub.args, state, TrainerControl())
    # a damaged state file is named in one line before anything is restored
    data = (tmp_path / "checkpoint-4" / STATE_FILE).read_bytes()
    (tmp_path / "checkpoint-4" / STATE_FILE).write_bytes(data[: len(data) // 2])
    damaged = TrainerMonitors([AttentionJacobianMonitor(every_n_steps=2, rows=4, seed=3)],
                              log_dir=str(tmp_path / "tb")).attach(Stub())
    with pytest.raises(ValueError, match=rf"{STATE_FILE}: .*remove it to resume"):
        damaged.trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))
