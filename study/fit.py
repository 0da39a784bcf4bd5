"""`study fit | validate | test`: LightningCLI over `CausalLMModule` and `TextDataModule`.

Every option of the Trainer, the model and the data comes from YAML or the command line (`study fit --help`,
`study fit --print_config`). Bad input ends in one line naming it, before anything heavy is built: a YAML syntax
error as file:line:column, an unknown option or a bad value with its key, a damaged `--ckpt_path` with what to do.
A misspelt option gets the closest one (difflib). A run that a `NonFiniteGuard` stopped is not a success (exit
code 1).

The console: Lightning's progress bar and model summary without their meaningless columns (``v_num``, "Epoch
0/-2" under ``max_steps``, a FLOPs column of zeros), and a last line naming the log folder and the final metrics.
The configs log under ``logs/fit/<config>/version_<n>``, apart from the sweeps' ``logs/<sweep>/``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import json
import logging
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelSummary, RichModelSummary, RichProgressBar, TQDMProgressBar
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.utilities.model_summary.model_summary import _format_summary_table
from typing_extensions import override

from study import data as data_module
from study import fit_help, memory, provenance, tags, trained_tokenizer
from study import model as model_module
from study.atomic import create_folder_exclusively
from study.callbacks.nonfinite import NonFiniteGuard
from study.checkpoints import checkpoint_problem
from study.console import silence_library_notices
from study.data import TextDataModule, shakespeare_files
from study.errors import BadValue, ConfigError, check_int, check_number, load_yaml, one_line
from study.model import CausalLMModule

_summary_log = logging.getLogger("lightning.pytorch.callbacks.model_summary")


class _WithoutVersion:
    """A progress bar without Lightning's ``v_num`` column (the logger's version number, not a metric)."""

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, int | str | float | dict]:
        items = super().get_metrics(trainer, pl_module)  # type: ignore[misc]
        items.pop("v_num", None)
        return items


class StudyRichProgressBar(_WithoutVersion, RichProgressBar):
    """Lightning's rich progress bar, without ``v_num`` and without "Epoch 0/-2" when the run is bounded by
    ``max_steps`` (Lightning sets ``max_epochs = -1`` then)."""

    def _get_train_description(self, current_epoch: int) -> str:  # Lightning's own (private) hook for the label
        if self.trainer.max_epochs is not None and self.trainer.max_epochs > 0:
            return super()._get_train_description(current_epoch)
        return f"Epoch {current_epoch}"


class StudyTQDMProgressBar(_WithoutVersion, TQDMProgressBar):
    """Lightning's tqdm progress bar, without ``v_num``."""


class StudyModelSummary(ModelSummary):
    """Lightning's model summary without its FLOPs column and total when they are 0 (Lightning counts FLOPs only
    for a module with an ``example_input_array``; ours has none, so the column is a row of zeros)."""

    @staticmethod
    @override
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        if total_flops:
            ModelSummary.summarize(summary_data, total_parameters, trainable_parameters, model_size,
                                   total_training_modes, total_flops, **summarize_kwargs)
            return
        columns = [(name, values) for name, values in summary_data if name != "FLOPs"]
        table = _format_summary_table(total_parameters, trainable_parameters, model_size, total_training_modes, 0,
                                      *columns)
        _summary_log.info("\n" + "\n".join(line for line in table.splitlines() if not line.endswith("Total Flops")))


class VerifiedCheckpointIO(CheckpointIO):
    """The trainer's checkpoint I/O, made safe on both sides; every load and save of a `study fit` goes through it.

    Load: the file is verified first (`study.checkpoints.checkpoint_problem`: every record's CRC-32, data only) and
    read with `weights_only=True` whatever the caller or the environment asked for, so `--ckpt_path last` (a keyword
    Lightning resolves to a file only here) gets the same check as a named file. Save: written in a folder of its
    own beside the target and renamed over it once flushed to disk, so a kill or a full disk during the write
    leaves the previous checkpoint whole instead of a truncated one, and no link planted beside it is followed.
    """

    def __init__(self, inner: CheckpointIO) -> None:
        self.inner = inner

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        target = Path(path)
        if "://" in str(path):  # a remote store: its own client writes it
            self.inner.save_checkpoint(checkpoint, path, storage_options=storage_options)
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        # A folder of its own, created by this call, holds the file while it is written: the inner writer opens it
        # by name (and fsspec moves a temporary file from /tmp onto it, a copy when /tmp is another file system),
        # so a predictable name beside the target would be written through any link planted there.
        aside = create_folder_exclusively(target.parent, target.name)
        try:
            tmp = aside / target.name
            self.inner.save_checkpoint(checkpoint, tmp, storage_options=storage_options)
            with open(tmp, "rb") as written:
                os.fsync(written.fileno())
            os.replace(tmp, target)
        finally:
            shutil.rmtree(aside, ignore_errors=True)

    @override
    def load_checkpoint(self, path: Any, map_location: Any | None = None, weights_only: bool | None = None) -> dict:
        if "://" not in str(path) and (problem := checkpoint_problem(path)):
            raise ConfigError(damaged_checkpoint_message(str(path), problem))
        return self.inner.load_checkpoint(path, map_location=map_location, weights_only=True)

    @override
    def remove_checkpoint(self, path: Any) -> None:
        self.inner.remove_checkpoint(path)

    @override
    def teardown(self) -> None:
        self.inner.teardown()


def verify_checkpoints(trainer: L.Trainer) -> None:
    """Route the trainer's checkpoint loads and saves through `VerifiedCheckpointIO` (once)."""
    strategy = trainer.strategy
    if not isinstance(strategy.checkpoint_io, VerifiedCheckpointIO):
        strategy.checkpoint_io = VerifiedCheckpointIO(strategy.checkpoint_io)


def damaged_checkpoint_message(path: str, problem: str) -> str:
    what = "it is not a checkpoint to trust" if problem.startswith("UnpicklingError") else "it is damaged"
    return (
        f"--ckpt_path {path} does not load ({problem}); {what}: remove it and resume from an earlier "
        "checkpoint of the run (or start over)"
    )


# Lightning's defaults -> the study's versions (exact types only: a user's own subclass is kept as it is).
_CONSOLE_CALLBACKS = {
    RichProgressBar: StudyRichProgressBar,
    TQDMProgressBar: StudyTQDMProgressBar,
    ModelSummary: StudyModelSummary,
    RichModelSummary: StudyModelSummary,
}


def quiet_console(trainer: L.Trainer) -> None:
    """Swap Lightning's default progress bar and model summary for versions without its meaningless columns."""
    for i, callback in enumerate(trainer.callbacks):
        replacement = _CONSOLE_CALLBACKS.get(type(callback))
        if replacement is StudyModelSummary:
            trainer.callbacks[i] = StudyModelSummary(max_depth=callback._max_depth)
        elif replacement is not None:
            trainer.callbacks[i] = replacement()


class ProvenanceText(L.Callback):
    """Writes the run's provenance record (`study.provenance`) once at fit start, as the TensorBoard text entry
    `tags.PROVENANCE` at the step the fit starts from (a resumed attempt adds its own)."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        text = provenance.as_markdown(self.record)
        for logger in trainer.loggers:
            experiment = getattr(logger, "experiment", None)
            if hasattr(experiment, "add_text"):
                experiment.add_text(tags.PROVENANCE, text, trainer.global_step)


def run_provenance(cli: LightningCLI, trainer: L.Trainer, argv: list[str]) -> dict[str, Any]:
    """The provenance record of the run `cli` builds from the command line ``argv``: its config chain, the model's
    dtype, the trainer's precision and the digests of its inputs (files inside its logger's folder, such as a
    sweep's own HParams experiment or pretrained model, are outputs: left out, as the sweep's `depends` does)."""
    config = cli.config.get(cli.subcommand) if getattr(cli, "subcommand", None) else cli.config
    resolved = config.as_dict() if hasattr(config, "as_dict") else {}
    parameter = next(iter(cli.model.parameters()), None) if getattr(cli, "model", None) is not None else None
    save_dir = getattr(trainer.logger, "save_dir", None) if trainer.logger is not None else None
    return provenance.collect(provenance.config_files(argv), precision=trainer.precision,
                              dtype=None if parameter is None else parameter.dtype,
                              inputs=provenance.input_digests(resolved, outputs=Path(save_dir) if save_dir else None))


# (source, target, when): arguments set from another one, never given (the parser refuses them; the help leaves them
# out). The model embeds exactly the tokenizer's vocabulary and checks the block size against its context; tokenizer
# "auto" / "model" reads the loaded model's own tokenizer.
LINKED = (
    ("data.vocab_size", "model.vocab_size", "instantiate"),
    ("data.block_size", "model.block_size", "parse"),
    ("model.model_name_or_path", "data.model_name_or_path", "parse"),
)


def _linked(section: str) -> tuple[str, ...]:
    """The init arguments of ``section`` (model, data) that a link sets."""
    return tuple(target.split(".", 1)[1] for _, target, _ in LINKED if target.startswith(section + "."))


class StudyCLI(LightningCLI):
    provenance: dict[str, Any] | None = None  # the run's record (`run_provenance`), once the trainer is built
    checked = True  # `preflight` before anything is built (`_TimingCLI` leaves it to the run it times)

    def instantiate_classes(self) -> None:
        """Build the model, the data and the trainer; a failure here is bad input (a value the classes refuse, a
        model or file that is not there), raised as `ConfigError` so that `study` exits 2, not 1 (a run that failed)."""
        if self.checked:
            preflight(self.config.get(self.subcommand) if self.subcommand else self.config)  # before anything is built
        try:
            super().instantiate_classes()
        except Exception as err:  # noqa: BLE001 - every failure to build from the config is the config's
            raise ConfigError(one_line(err)) from err

    @override
    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        if self.subcommand == "fit":  # before the trainer, the optimiser or any step: the bound is known by now
            trainer_config = self.config[self.subcommand]["trainer"]
            if refused := step_memory_refused(self.model, self.datamodule, trainer_config):
                raise ConfigError(refused)
        trainer = super().instantiate_trainer(**kwargs)
        quiet_console(trainer)
        verify_checkpoints(trainer)
        self.provenance = run_provenance(self, trainer, sys.argv[1:])
        trainer.callbacks.append(ProvenanceText(self.provenance))
        return trainer

    def add_arguments_to_parser(self, parser) -> None:
        for source, target, apply_on in LINKED:
            parser.link_arguments(source, target, apply_on=apply_on)


def step_shape(module: CausalLMModule, data: TextDataModule, precision: str) -> memory.StepShape:
    """The numbers that fix a training step's memory (`study.memory`), read off the built model and data."""
    from study.attention import blockwise

    config, hp = module.model.config, module.hparams
    width, heads = int(config.hidden_size), int(config.num_attention_heads)
    mlp = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * width
    batch, length = int(data.hparams.batch_size), int(data.hparams.block_size)
    params = {p.data_ptr(): p for p in module.model.parameters()}.values()  # tied weights once
    spec = module.attention  # the AttentionSpec (hparams keep it as a dict)
    explicit = 0 if spec.is_stock_softmax else len(spec.layers or range(config.num_hidden_layers))
    rows = blockwise.block_rows(batch * heads, length, length) or length
    half = "16" in precision and "64" not in precision
    return memory.StepShape(
        parameters=sum(p.numel() for p in params), trainable=sum(p.numel() for p in params if p.requires_grad),
        optimizer_states=2 if hp.optimizer == "adamw" else 0, batch=batch, length=length, vocab=int(config.vocab_size),
        layers=int(config.num_hidden_layers), width=width, mlp_width=int(mlp),
        weight_bytes=2 if half and precision.endswith("-true") else 8 if "64" in precision else 4,
        activation_bytes=2 if half else 8 if "64" in precision else 4,
        checkpointing=bool(hp.gradient_checkpointing), scores=batch * heads * rows * length, explicit_layers=explicit,
    )  # fmt: skip


def step_memory_refused(module: CausalLMModule, data: TextDataModule, trainer_config) -> str | None:
    """One line when a training step's lower bound exceeds what this machine offers it (`study.memory`)."""
    import torch

    precision, accelerator = str(trainer_config.get("precision") or "32"), str(trainer_config.get("accelerator"))
    on_cuda = accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available()
    limit = memory.cuda_limit() if on_cuda else memory.host_limit()
    return memory.refusal(memory.step_lower_bound(step_shape(module, data, precision)), limit)


class _TimingCLI(StudyCLI):
    """A run's command line with a few steps' timing settings on top (the sweep's estimate: no validation, fewer
    steps than its warm-up): the run's own arguments passed `preflight` when the sweep checked its plan; these
    settings time its steps and train nothing anyone reads, so they are not refused as a run's would be."""

    checked = False


def lightning_main(args: list[str] | None = None, run: bool = True, timing: bool = False, **cli_kwargs) -> StudyCLI:
    """Build (and by default run) the LightningCLI; ``args`` replaces the command line when given. ``timing``: the
    sweep's step timing (`_TimingCLI`), whose settings no run trains with.

    ``args`` become the process's own command line (``sys.argv[1:]``) while the CLI is built and run, and
    LightningCLI parses ``sys.argv``. Lightning's DDP launcher starts the other ranks by re-executing
    ``sys.argv``: they must get the very `study fit ...` command this process runs, not a truncated one.
    """
    kwargs = dict(save_config_kwargs={"overwrite": False}, parser_kwargs=_parser_kwargs())
    kwargs.update(cli_kwargs)
    silence_library_notices()
    argv = sys.argv
    if args is not None:
        sys.argv = [argv[0], *args]
    try:
        cli_class = _TimingCLI if timing else StudyCLI
        return cli_class(CausalLMModule, TextDataModule, args=None, run=run, **kwargs)
    finally:
        sys.argv = argv


class _ParseOnly(StudyCLI):
    """Parses and validates a `study fit` command line without building the model, the data or the trainer."""

    def _set_seed(self) -> None:  # LightningCLI's private step: parsing must not seed (or print) anything
        return None

    def instantiate_classes(self) -> None:
        # The parser checks each value's type; `preflight` every value's range and the rules that join values.
        preflight(self.config.get(self.subcommand) if self.subcommand else self.config)


def check_fit_args(args: list[str]) -> str | None:
    """None if `study fit <args>` parses (every key known, every value of its type) and passes `preflight`, else
    the one line that names the key and the value.

    A sweep calls this for every run before the first one starts: a typo such as `trainer.max_stepz` in the
    overrides is refused up front instead of failing each run after it has started.
    """
    argv = sys.argv
    sys.argv = [argv[0], *args]
    try:
        _ParseOnly(
            CausalLMModule,
            TextDataModule,
            args=None,
            run=False,
            parser_kwargs=_parser_kwargs(),
            save_config_callback=None,
        )
    except Exception as err:  # noqa: BLE001 - the parser's own message is the answer
        hint = closest_option(one_line(err))
        return one_line(err) + (f"; did you mean --{hint}?" if hint else "")
    finally:
        sys.argv = argv
    return None


# ---- preflight: every value checked before anything is built -----------------------------------------------
def _plain(section: Any) -> dict[str, Any]:
    """A parsed config section (jsonargparse Namespace or dict) as a dict of its top-level keys."""
    if section is None:
        return {}
    if hasattr(section, "as_dict"):
        return section.as_dict()
    return dict(section)


@dataclasses.dataclass
class ModelShape:
    """What a run's model has, read from its arguments or its config.json (never its weights): None when unknown."""

    n_layer: int | None
    n_head: int | None
    context: int | None


def model_shape(model: dict[str, Any]) -> ModelShape:
    """The layers, heads and context of the model a `model:` section trains: the size arguments of a GPT-2 from
    scratch, else the config.json of a model folder (an embedded model's only once materialised); else unknown."""
    name = model.get("model_name_or_path")
    if not name:
        return ModelShape(model.get("n_layer"), model.get("n_head"), model.get("n_positions"))
    folder = _model_folder(str(name))
    try:
        config = json.loads((folder / "config.json").read_text()) if folder is not None else None
    except (OSError, ValueError):
        config = None
    if not isinstance(config, dict):
        return ModelShape(None, None, None)

    def first(*keys: str) -> int | None:
        found = next((config[k] for k in keys if isinstance(config.get(k), int)), None)
        return found

    return ModelShape(first("num_hidden_layers", "n_layer"), first("num_attention_heads", "n_head"),
                      first("max_position_embeddings", "n_positions", "n_ctx"))


def _model_folder(name: str) -> Path | None:
    """The folder a model name is read from, without building anything (an embedded model not yet materialised,
    a gguf or a hub name: None)."""
    from study.pretrained import EMBEDDED_MODELS, cache_key, cache_root, embedded_gguf

    if name in EMBEDDED_MODELS:
        try:
            source = embedded_gguf(name)
        except (OSError, ValueError):
            return None
        folder = cache_root() / f"{source.stem}-{cache_key(source)}"
        return folder if folder.is_dir() else None
    path = Path(name).expanduser()
    return path if path.is_dir() else None


def _trained_tokenizer(name: str) -> tuple[str, str] | None:
    """(digest, where) of the tokenizer the model ``name`` was trained with (`study.trained_tokenizer`): a model
    folder's record or its own saved tokenizer, GPT-2's BPE for a hub GPT-2; None when unknown without building
    anything (another hub name, an embedded model not yet materialised, a folder with neither)."""
    folder = _model_folder(name)
    if folder is not None:
        return trained_tokenizer.trained_with(folder)
    if name.removeprefix("openai-community/") in data_module.GPT2_NAMES and not Path(name).exists():
        return trained_tokenizer.named_tokenizer_digest("gpt2"), f"GPT-2's BPE, the tokenizer of hub model {name}"
    return None


def _run_tokenizer(data: dict[str, Any], own: Path | None) -> tuple[str, str] | None:
    """(digest, where) of the tokenizer a run's data will use: ``own`` (the model folder's, for "auto" and
    "model"), a tokenizer folder, GPT-2's BPE, or the corpus BPE (trained into its cache now, as the run would
    first thing); None when it cannot be read here (the data module then names why)."""
    choice = data.get("tokenizer", "corpus-bpe")
    source = own if choice in ("auto", "model") else choice
    if source is None:
        return None
    if Path(source).is_dir():
        digest = trained_tokenizer.saved_tokenizer_digest(source)
        return (digest, f"the tokenizer saved in {source}") if digest is not None else None
    if source == "gpt2":
        return trained_tokenizer.named_tokenizer_digest("gpt2"), "gpt2, GPT-2's BPE"
    if source != "corpus-bpe":
        return None
    accepted = inspect.signature(TextDataModule).parameters
    try:
        built = TextDataModule(**{k: v for k, v in data.items() if k in accepted})
        return trained_tokenizer.tokenizer_digest(built.tokenizer), f"the corpus BPE {built.tokenizer_origin()}"
    except (OSError, ValueError):
        return None


def _check_tokenizer(model: dict[str, Any], data: dict[str, Any]) -> None:
    """A model loaded from a folder or by name trains on the ids of the tokenizer it was trained with, compared by
    content (`study.trained_tokenizer`): another tokenizer, whatever its size, is refused naming both. Its own
    tokenizer ("auto", "model") is read only when a record says which one it trained with."""
    name = model.get("model_name_or_path")
    if not name:
        return
    folder = _model_folder(str(name))
    choice = data.get("tokenizer", "corpus-bpe")
    if choice in ("auto", "model") and (folder is None or trained_tokenizer.read_record(folder) is None):
        return  # the model's own tokenizer is the one it was trained with: nothing read
    trained = _trained_tokenizer(str(name))
    if trained is None:
        return
    used = _run_tokenizer(data, folder)
    if used is not None and (problem := trained_tokenizer.mismatch(str(name), trained, used)):
        raise BadValue("data.tokenizer", choice, problem)


def _check_steps(key: str, value: Any) -> int:
    """`trainer.max_steps`: -1 (no limit) or a positive number of steps."""
    if isinstance(value, int) and not isinstance(value, bool) and value == -1:
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadValue(key, value, "must be -1 (no step limit) or an integer >= 1")
    return value


def _check_batches(key: str, value: Any) -> None:
    """A Lightning batch count: an integer >= 1 (batches) or a fraction in (0, 1] (of the loader), or null."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return
    if isinstance(value, float) and 0 < value <= 1:
        return
    raise BadValue(key, value, "must be an integer >= 1 (batches) or a fraction in (0, 1] (0 would skip it)")


def _check_trainer(trainer: dict[str, Any]) -> int | None:
    """The trainer's values the study's runs depend on; returns the step limit (None: none)."""
    max_steps = _check_steps("trainer.max_steps", trainer.get("max_steps", -1))
    check_int("trainer.log_every_n_steps", trainer.get("log_every_n_steps"), minimum=1, none=True)
    check_int("trainer.accumulate_grad_batches", trainer.get("accumulate_grad_batches", 1), minimum=1)
    check_number("trainer.gradient_clip_val", trainer.get("gradient_clip_val"), minimum=0, none=True)
    for name in ("limit_train_batches", "limit_val_batches", "val_check_interval"):
        _check_batches(f"trainer.{name}", trainer.get(name))
    return max_steps if max_steps > 0 else None


def _check_attention(model: dict[str, Any]) -> Any:
    """The attention spec, built from the section (its own rules: normaliser, T > 0, top-k with the normaliser)."""
    from study.attention import AttentionSpec

    attention = model.get("attention")
    if attention is None or isinstance(attention, AttentionSpec):
        return attention
    try:
        return AttentionSpec(**_plain(attention))
    except (TypeError, ValueError) as err:
        raise ConfigError(f"--model.attention: {one_line(err)}") from None


def _check_layers_in(key: str, layers: Any, n_layer: int | None) -> None:
    """Layer indices (negative from the end, "mid") within a model of ``n_layer`` layers."""
    if layers is None or n_layer is None:
        return
    for entry in layers:
        if isinstance(entry, int) and not isinstance(entry, bool) and not -n_layer <= entry < n_layer:
            raise BadValue(key, list(layers), f"layer {entry} is not among the model's {n_layer} layers "
                                              f"(0..{n_layer - 1}, or -{n_layer}..-1 from the end)")


def _training_text_bytes(data: dict[str, Any]) -> int | None:
    """Bytes of the training text of a local source (the embedded corpus, files); None for a hub dataset."""
    try:
        if data.get("source", "shakespeare") == "shakespeare":
            files = shakespeare_files()["train"]
        elif data.get("source") == "files":
            files = list(data.get("train_files") or [])
        else:
            return None
        return sum(Path(f).stat().st_size for f in files)
    except OSError:
        return None  # a missing file: the data module names it


def _check_callbacks(callbacks: list, shape: ModelShape, data: dict[str, Any]) -> None:
    """Each of the study's callbacks built from its arguments (its own rules, light: nothing is tapped or read),
    then the rules that join its arguments to the run's (layers and heads within the model, k within the block,
    Jacobian rows within what a step's attention call has). A period longer than the run is not refused: a monitor
    measures at step 0 and at the last step whatever its period (`study.callbacks.base.due`), so a config's periods
    stay meaningful under a shorter `--trainer.max_steps`."""
    import importlib

    block, batch = data.get("block_size"), data.get("batch_size")
    for entry in callbacks or []:
        entry = _plain(entry)
        class_path = str(entry.get("class_path", ""))
        if not class_path.startswith("study.callbacks"):
            continue
        module_name, _, class_name = class_path.rpartition(".")
        args = _plain(entry.get("init_args"))
        key = f"trainer.callbacks.{class_name}"
        try:
            callback = getattr(importlib.import_module(module_name), class_name)(**args)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"{key}: {one_line(err)}") from None
        ks = getattr(callback, "selection_ks", None)
        if ks and isinstance(block, int) and max(ks) > block:
            raise BadValue(f"{key}.selection_ks", list(ks), f"each k must be <= data.block_size = {block} (a row "
                                                            "has no more keys)")
        layers = getattr(callback, "layers", None)
        _check_layers_in(f"{key}.layers", layers, shape.n_layer)
        heads = getattr(callback, "heads", None)
        if heads is not None and shape.n_head is not None and any(not 0 <= h < shape.n_head for h in heads):
            raise BadValue(f"{key}.heads", list(heads), f"the model has heads 0..{shape.n_head - 1}")
        rows = getattr(callback, "rows", None)
        if isinstance(rows, int) and shape.n_head and isinstance(block, int) and isinstance(batch, int):
            most = batch * shape.n_head * block
            if rows > most:
                raise BadValue(f"{key}.rows", rows, f"must be <= the {most} attention rows of one call (data.batch_size "
                                                    f"{batch} x {shape.n_head} heads x data.block_size {block})")


def preflight(config: Any) -> None:
    """Every value of a `study fit` config checked before anything is built, each broken rule raised as one line
    that names the key and the value (`study.errors.BadValue`).

    Each class's own rules come from the class (`study.model.check_arguments`, `study.data.check_arguments`, the
    attention spec, each study callback built from its arguments); the rules that join values of several sections
    are here: warm-up, validation interval and monitor periods within the steps, top-k and selection k within the
    block, layers and heads within the model (from its arguments or config.json, never its weights), the block
    within the model's context, a batch the training text can fill, the tokenizer the model was trained with
    (`study.trained_tokenizer`). `study fit` runs it before building; `study
    sweep` runs it (through `check_fit_args`) for every run of its plan before the first one starts.
    """
    config = config or {}
    get = config.get if hasattr(config, "get") else (lambda key, default=None: getattr(config, key, default))
    model, data, trainer = _plain(get("model")), _plain(get("data")), _plain(get("trainer"))
    attention = _check_attention(model)
    data_module.check_arguments(data, prefix="data.")  # first: the model's block_size is linked from the data's
    model_module.check_arguments({k: v for k, v in model.items() if k != "attention"}, prefix="model.")
    max_steps = _check_trainer(trainer)
    warmup = model.get("warmup_steps")
    if max_steps is not None and isinstance(warmup, int) and warmup > max_steps:
        # the schedule warms up over min(warmup_steps, steps): a longer warm-up would train another schedule than
        # the one the run is labelled with
        raise BadValue("model.warmup_steps", warmup, f"must be <= trainer.max_steps = {max_steps} (the run would "
                                                    f"warm up over {max_steps} steps, not {warmup})")
    interval = trainer.get("val_check_interval")
    if max_steps is not None and isinstance(interval, int) and not isinstance(interval, bool) and interval > max_steps:
        raise BadValue("trainer.val_check_interval", interval, f"must be <= trainer.max_steps = {max_steps}: the run "
                                                              "would never validate after training (its result "
                                                              "would be the step-0 baseline)")
    block = data.get("block_size")
    top_k = getattr(attention, "top_k", None)
    if isinstance(top_k, int) and isinstance(block, int) and top_k >= block:
        raise BadValue("model.attention.top_k", top_k, f"must be < data.block_size = {block}: it would select every "
                                                       "key, the same run as top_k null (all)")
    shape = model_shape(model)
    _check_layers_in("model.attention.layers", getattr(attention, "layers", None), shape.n_layer)
    if shape.context is not None and isinstance(block, int) and block > shape.context:
        raise BadValue("data.block_size", block, f"must be <= the model's context of {shape.context} positions")
    text = _training_text_bytes(data)
    if text is not None and isinstance(block, int) and isinstance(data.get("batch_size"), int):
        most = text // block  # every token is at least one byte: the text gives at most this many blocks
        cap = data.get("max_train_blocks")
        most = min(most, cap) if isinstance(cap, int) else most
        if data["batch_size"] > most:
            raise BadValue("data.batch_size", data["batch_size"], f"must be <= the at most {most} training blocks "
                                                                  f"of {block} tokens the training text gives")
    _check_callbacks(trainer.get("callbacks"), shape, data)
    _check_tokenizer(model, data)  # last: it may read a tokenizer, or train the corpus BPE as the run would


def _parser_kwargs() -> dict:
    # Parse errors raise (ArgumentError) instead of printing the whole usage and exiting: `main` makes them one
    # line, and a sweep records them in the run's status.
    kwargs: dict = {"exit_on_error": False, "allow_abbrev": False}
    if _has_omegaconf():
        kwargs["parser_mode"] = "omegaconf"
    return kwargs


def _has_omegaconf() -> bool:
    return importlib.util.find_spec("omegaconf") is not None


def main(argv: list[str]) -> int:
    """`study fit|validate|test ...` (the verb first, as LightningCLI takes it); errors propagate to `study.cli`.

    Ends with one line naming the log folder and the final metrics. ``--help`` prints the study's own options
    (`short_help`); ``--help-all`` LightingCLI's full help."""
    verb = argv[0] if argv and not argv[0].startswith("-") else "fit"
    if "--help-all" in argv:
        argv = [("--help" if a == "--help-all" else a) for a in argv]
    elif "-h" in argv or "--help" in argv:  # `study.cli` answers this first, from `study.fit_help`, without Lightning
        print(fit_help.page(verb))
        return 0
    for path in provenance.config_files(argv):
        load_yaml(path)  # a YAML syntax error as file:line:column, before LightningCLI's usage text
    _check_ckpt_path(argv)
    try:
        cli = lightning_main(argv)
    except Exception as err:  # noqa: BLE001 - re-raised, with the closest option name when one is misspelt
        hint = closest_option(one_line(err))
        if hint:
            raise ConfigError(f"{one_line(err)}; did you mean --{hint}?") from None
        raise
    diverged = _diverged(cli)
    print(f"study {verb}: {final_line(getattr(cli, 'trainer', None))}")
    if diverged:
        print(f"study fit: stopped, {diverged}", file=sys.stderr)
        return 1
    untrained = trained_nothing(cli.trainer) if argv and argv[0] == "fit" else None
    if untrained:
        print(f"study fit: {untrained}", file=sys.stderr)
        return 1
    return 0


def trained_nothing(trainer) -> str | None:
    """Why a fit that returned trained no step (`max_steps=0`, `limit_train_batches=0`, ...); None if it trained.

    Lightning ends such a fit quietly, as if it had finished; a run with no step is not a result.
    """
    if trainer is None or trainer.global_step > 0 or trainer.interrupted:
        return None
    return (
        f"trained no step (max_steps={trainer.max_steps}, limit_train_batches={trainer.limit_train_batches}): "
        "the run is not a result"
    )


SHOWN_METRICS = (tags.VAL_LOSS, tags.VAL_PPL, tags.TRAIN_LOSS)


def final_line(trainer) -> str:
    """Where the run's logs are and what it ended with: ``logs in logs/fit/default/version_0; val/loss 3.2, ...``."""
    log_dir = getattr(trainer, "log_dir", None) if trainer is not None else None
    metrics = getattr(trainer, "callback_metrics", {}) or {}
    shown = [f"{tag} {float(metrics[tag]):.4g}" for tag in SHOWN_METRICS if tag in metrics]
    where = f"logs in {log_dir}" if log_dir else "no logger"
    return f"{where}; " + (", ".join(shown) if shown else "no metric logged") + f" (step {getattr(trainer, 'global_step', 0)})"


def _option_classes() -> dict[str, type]:
    import lightning as L

    return {"trainer": L.Trainer, "model": CausalLMModule, "data": TextDataModule}


def _options_of(prefix: str) -> list[str]:
    """The init arguments of the class an option prefix (`model.attention`) configures; [] when unknown."""
    import inspect
    import typing

    parts = prefix.split(".")
    cls = _option_classes().get(parts[0])
    for part in parts[1:]:
        if cls is None:
            return []
        try:
            hint = typing.get_type_hints(cls.__init__).get(part)
        except Exception:  # noqa: BLE001 - an unresolvable annotation: no suggestion
            return []
        cls = next((c for c in (*typing.get_args(hint), hint) if inspect.isclass(c) and c is not type(None)), None)
    if cls is None:
        return []
    return [name for name in inspect.signature(cls).parameters if name not in ("self", "args", "kwargs")]


def closest_option(message: str) -> str | None:
    """The dotted option a parser message about an unknown one most likely meant (difflib), else None.

    Reads jsonargparse's two forms: ``--model.attention: Option 'temprature' is not accepted`` and
    ``unrecognized arguments: --trainer.max_stepz=3``.
    """
    import difflib
    import re

    found = re.search(r"--([\w.]+): Option '(\w+)' is not accepted", message)
    if found:
        prefix, name = found.groups()
    elif found := re.search(r"unrecognized arguments: --([\w.]+)", message):
        prefix, _, name = found.group(1).rpartition(".")
        if not prefix:
            return None
    else:
        return None
    close = difflib.get_close_matches(name, _options_of(prefix), n=1)
    return f"{prefix}.{close[0]}" if close else None


# `--ckpt_path` words Lightning resolves itself (`ckpt_path="last"` and friends), not file names
CKPT_PATH_KEYWORDS = ("last", "best", "hpc", "registry")


def _check_ckpt_path(argv: list[str]) -> None:
    """A `--ckpt_path` that is not a checkpoint file that loads is named, with what to do, before anything is built:
    no such file, a folder, a damaged file, one that holds anything but data."""
    paths = [a.split("=", 1)[1] for a in argv if a.startswith("--ckpt_path=")]
    paths += [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--ckpt_path"]
    for path in paths:
        if path in CKPT_PATH_KEYWORDS or path.startswith(CKPT_PATH_KEYWORDS[-1] + ":") or "://" in path:
            continue
        if Path(path).is_dir():
            raise ConfigError(f"--ckpt_path {path} is a folder, not a checkpoint file (a run keeps its checkpoints "
                              "in <run>/checkpoints/*.ckpt)")
        if not Path(path).exists():
            raise ConfigError(f"--ckpt_path {path}: no such file")
        if problem := checkpoint_problem(path):
            raise ConfigError(damaged_checkpoint_message(path, problem))


def _diverged(cli: StudyCLI) -> str | None:
    """The reason a `NonFiniteGuard` stopped the run, if one did (a diverged run is not a success)."""
    trainer = getattr(cli, "trainer", None)
    for callback in getattr(trainer, "callbacks", None) or []:
        if isinstance(callback, NonFiniteGuard) and callback.diverged:
            return callback.diverged["reason"]
    return None


# ---- `study fit --help`: the study's own options first, in a page ---------------------------------------------
# LightningCLI's help lists every option of the Trainer, the model and the data, about 700 lines, with the attention
# spec (temperature, top_k, the normaliser) only under `--model.attention.help AttentionSpec`. This short form is
# generated from the classes themselves (their signatures and the `Args:` of their docstrings), so it cannot drift
# from the options the parser accepts; `--help-all` is LightningCLI's.
# Trainer options a study run is usually steered by (the rest: --help-all)
TRAINER_OPTIONS = ("max_steps", "val_check_interval", "gradient_clip_val", "devices", "strategy", "precision")


def _arg_lines(doc: str | None) -> dict[str, str]:
    """{name: first sentence of its description} from a Google-style ``Args:`` section ("a, b: text" names both)."""
    out: dict[str, str] = {}
    lines = (doc or "").splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Args:")
    except StopIteration:
        return out
    indent, names, text = None, None, []

    def flush() -> None:
        if names:
            out.update({name: _first_sentence(" ".join(text)) for name in names})

    for line in lines[start + 1 :]:
        if not line.strip():
            if names:
                continue
            break
        width = len(line) - len(line.lstrip())
        indent = width if indent is None else indent
        if width < indent:
            break
        match = re.match(r"\s*([\w, ]+):\s*(.*)", line) if width == indent else None
        if match:
            flush()
            names, text = [n.strip() for n in match.group(1).split(",")], [match.group(2)]
        else:
            text.append(line.strip())
    flush()
    return out


def _first_sentence(text: str, width: int = 100) -> str:
    """Up to the first ". X" or ";" outside parentheses, cut at ``width`` characters."""
    depth = 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and (char == ";" or (char == "." and text[i + 1 : i + 3].strip()[:1].isupper())):
            text = text[:i]
            break
    text = text.strip().rstrip(".")
    return text if len(text) <= width else text[: width - 3].rstrip() + "..."


def _options(prefix: str, params: list[tuple[str, str, object]], doc: str | None, skip: tuple[str, ...] = ()) -> list[str]:
    described = _arg_lines(doc)
    rows = []
    for name, annotation, default in params:
        if name in skip:
            continue
        shown = "" if default is inspect.Parameter.empty else f" = {default!r}"
        rows.append((f"  --{prefix}{name}", f"{annotation}{shown}", described.get(name, "")))
    width = max(len(r[0]) for r in rows) + 2
    return [f"{flag:<{width}}{kind}" + (f"\n{'':<{width}}{what}" if what else "") for flag, kind, what in rows]


def _signature(cls) -> list[tuple[str, str, object]]:
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    return [(p.name, str(p.annotation), p.default) for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]


def short_help(verb: str = "fit") -> str:
    from study.attention import AttentionSpec

    spec = [(f.name, str(f.type), f.default) for f in dataclasses.fields(AttentionSpec) if f.init]
    return "\n".join([
        f"usage: study {verb} --config CONFIG [--model.attention.temperature=T] [--model.attention.top_k=K] [...]",
        "",
        f"study {verb}: one run (LightningCLI over CausalLMModule and TextDataModule). The study's own options; "
        "any of them also in a YAML config (configs/default.yaml, configs/smollm2.yaml).",
        "",
        "The attention spec (study.attention.AttentionSpec):",
        *_options("model.attention.", spec, AttentionSpec.__doc__),
        "",
        "The model (study.model.CausalLMModule):",
        *_options("model.", _signature(CausalLMModule), CausalLMModule.__doc__, skip=("attention", *_linked("model"))),
        "",
        "The data (study.data.TextDataModule):",
        *_options("data.", _signature(TextDataModule), TextDataModule.__doc__, skip=_linked("data")),
        "",
        "The trainer (lightning.Trainer), the usual ones: " + ", ".join(f"--trainer.{o}" for o in TRAINER_OPTIONS),
        "",
        "  --config FILE          a YAML config (repeatable; later ones and the command line override earlier ones)",
        "  --print_config         print the resolved config and exit",
        "  --help-all             every LightningCLI option (Trainer, callbacks, logger, optimizer), about 700 lines",
        "",
        "Options are spelt in full: an abbreviation (--trainer.max_step) is refused, with the closest name.",
    ])


# `study fit --help` must answer in a moment, and importing Lightning alone takes seconds: the page is generated
# here (where the classes are) into `study/fit_help.py`, which imports nothing; tests/test_cli_help.py checks that the
# committed page is what `short_help` gives now and that its options are the parser's.
HELP_MODULE = Path(__file__).with_name("fit_help.py")


def help_module_text() -> str:
    """The source of `study/fit_help.py`: `short_help` with the verb left as `fit_help.VERB`."""
    lines = short_help(fit_help.VERB).splitlines()
    return "\n".join([
        '"""`study fit|validate|test --help`: the study\'s own options in a page, generated by `study.fit.write_help_module`',
        "from the classes LightningCLI builds its parser from, so that the page answers without importing Lightning.",
        "",
        "Do not edit: after changing an option or its docstring, regenerate it (tests/test_cli_help.py fails until then):",
        '    python -c "from study.fit import write_help_module; write_help_module()"',
        '"""',
        "",
        f"VERB = {fit_help.VERB!r}  # stands for the verb (fit, validate, test) in PAGE",
        "PAGE = \"\\n\".join([",
        *(f"    {line!r}," for line in lines),
        "])",
        "",
        "",
        "def page(verb: str = \"fit\") -> str:",
        '    """The help page of `study <verb>`."""',
        "    return PAGE.replace(VERB, verb)",
        "",
    ])  # fmt: skip


def write_help_module(path: Path = HELP_MODULE) -> Path:
    """Write `help_module_text` to ``path`` (the package's `study/fit_help.py`)."""
    path.write_text(help_module_text())
    return path
