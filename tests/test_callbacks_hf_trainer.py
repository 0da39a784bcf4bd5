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
