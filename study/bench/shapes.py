"""What `study bench` measures: model shapes, attention variants and run settings."""

from __future__ import annotations

from dataclasses import dataclass, field

MONITOR_NAMES = ("AttentionEntropyMonitor", "SelectionUniformityMonitor", "GradientNormMonitor", "AttentionJacobianMonitor",
                 "AttentionMapMonitor", "AttentionLogitMonitor", "AttentionSinkMonitor", "EntropyCollapseAlert")
H100_BF16_PEAK_FLOPS = 989e12


@dataclass(frozen=True)
class Shape:
    """A randomly initialised model (no hub, no download): a GPT-2, or a Llama with grouped-query attention.

    ``one_at_a_time`` shapes are too large to hold one model per variant in memory at once (13 variants x 2.2 GB
    for SmolLM2 with AdamW state): their variants take turns as whole short fits instead of interleaved steps.
    """

    name: str
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    vocab_size: int = 8192
    batch_size: int = 8
    seq_len: int = 128
    arch: str = "gpt2"  # gpt2 | llama
    n_kv_head: int | None = None  # llama: key/value heads (grouped-query attention when < n_head)
    n_inner: int | None = None  # llama: MLP width
    one_at_a_time: bool = False


SHAPES = {
    "small": Shape("small"),
    "gpt2-vocab": Shape("gpt2-vocab", vocab_size=50257),
    "gpt2-124m": Shape("gpt2-124m", n_layer=12, n_head=12, n_embd=768, vocab_size=50257),
    # SmolLM2-135M's architecture (the study's embedded real model): 30 Llama blocks, 9 query / 3 key-value heads.
    # Batch 2 x 128, the main job's step, keeps its 13 variants within minutes on a 2-core CPU.
    "smollm2": Shape("smollm2", n_layer=30, n_head=9, n_embd=576, vocab_size=49152, batch_size=2, seq_len=128,
                     arch="llama", n_kv_head=3, n_inner=1536, one_at_a_time=True),
    # The GPU suite (`--gpu-suite`): GPT-2 124M at three lengths, the same 8192 tokens per step.
    "gpt2-124m-L512": Shape("gpt2-124m-L512", n_layer=12, n_head=12, n_embd=768, vocab_size=50257, batch_size=16,
                            seq_len=512),
    "gpt2-124m-L1024": Shape("gpt2-124m-L1024", n_layer=12, n_head=12, n_embd=768, vocab_size=50257, batch_size=8,
                             seq_len=1024),
    "gpt2-124m-L2048": Shape("gpt2-124m-L2048", n_layer=12, n_head=12, n_embd=768, vocab_size=50257, batch_size=4,
                             seq_len=2048),
}
GPU_SUITE = ("gpt2-124m-L512", "gpt2-124m-L1024", "gpt2-124m-L2048")


@dataclass
class Variant:
    name: str
    group: str  # stock | temperature | top_k | normalizer | monitors
    implementation: str  # sdpa | eager | study
    spec: dict = field(default_factory=dict)  # AttentionSpec keywords
    monitor_every: int | None = None
    monitors: tuple[str, ...] = ()  # the monitor classes it runs, by name; () for every one (MONITOR_NAMES)


@dataclass
class Settings:
    shapes: list[Shape]
    rounds: int = 8
    chunk: int = 4
    warmup: int = 4
    top_ks: tuple[int, ...] = (4, 16, 64)
    normalizers: tuple[str, ...] = ("sparsemax", "entmax15", "entmax", "ssmax", "self_adjust")
    temperature: float = 0.5
    monitor_every: tuple[int, ...] = (1, 50)
    per_monitor: bool = False  # also each monitor alone, logging every step: what each adds to a logging step
    # Shapes with a large vocabulary (4-6x slower steps) run this fraction of the rounds and chunk.
    large_vocab_fraction: float = 0.5
    analysis_lengths: tuple[int, ...] = (512,)
    analysis_repeats: int = 3
    analysis_oracle_rows: int | None = 64
    peak_flops: float = H100_BF16_PEAK_FLOPS
    device: str = "cpu"
    precision: str = "32-true"
    parity: bool = False  # also check every attention path against stock on a batch (`study.bench.parity`)
    fresh_process: bool = True  # each variant's memory pass in a process of its own: its peak resident memory


def variants(settings: Settings, monitors_available: bool) -> list[Variant]:
    out = [
        Variant("stock sdpa", "stock", "sdpa"),
        Variant("stock eager", "stock", "eager"),
        Variant(f"temperature T={settings.temperature}", "temperature", "study", {"temperature": settings.temperature}),
    ]
    out += [Variant(f"top-k k={k}", "top_k", "study", {"top_k": k}) for k in settings.top_ks]
    out += [Variant(f"{name}", "normalizer", "study", {"normalizer": name}) for name in settings.normalizers]
    if monitors_available:
        out += [
            Variant(f"T={settings.temperature} + monitors every {n}", "monitors", "study",
                    {"temperature": settings.temperature}, monitor_every=n)
            for n in settings.monitor_every
        ]
    if monitors_available and settings.per_monitor:
        out += [
            Variant(f"T={settings.temperature} + {name} every 1", "monitors", "study", {"temperature": settings.temperature},
                    monitor_every=1, monitors=(name,))
            for name in MONITOR_NAMES
        ]
    return out


def monitor_classes() -> tuple[list[type], str | None]:
    """The monitor callbacks `study.callbacks` has now, and a note naming any that are missing."""
    try:
        import study.callbacks as callbacks
    except ImportError as error:  # pragma: no cover - the package always exists
        return [], f"study.callbacks not importable ({error})"
    found = [getattr(callbacks, name) for name in MONITOR_NAMES if hasattr(callbacks, name)]
    missing = [name for name in MONITOR_NAMES if not hasattr(callbacks, name)]
    note = None
    if missing:
        note = f"study.callbacks lacks {', '.join(missing)}: " + ("monitor rows skipped" if not found else "measured without them")
    return found, note
