"""The report in TensorBoard: the plain-language summary and the scorecard as Text, the key figures as Images.

Written by `study report` into its own folder (`<sweep>/report/`), which TensorBoard lists as the run "report"
beside the sweep's runs: it holds no scalars and no HParams session, so it adds no line to any chart and no row to
the HParams table. Built from tensorboard's own protocol buffers (no torch, no Lightning: `study report` loads
neither); a rewrite replaces the folder's earlier report events, so one report is shown, not a history.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path

from study import tags

# the figures that answer "what does T do to gradients and attention", in the order the Images tab shows them
KEY_FIGURES = ("sensitivity_vs_T.png", "layer_sensitivity.png", "ppl_heatmap.png", "attention_vs_T.png",
               "dilution_vs_n.png", "stability_vs_T.png", "arms.png", "curves.png")  # fmt: skip


def _png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk; ValueError for anything that is not a PNG."""
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise ValueError("not a PNG file")
    return struct.unpack(">II", data[16:24])


def text_value(tag: str, markdown: str):
    from tensorboard.compat.proto import types_pb2
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.compat.proto.tensor_pb2 import TensorProto
    from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto

    metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text"))
    tensor = TensorProto(dtype=types_pb2.DT_STRING, string_val=[markdown.encode()],
                         tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]))  # fmt: skip
    return Summary.Value(tag=tag, metadata=metadata, tensor=tensor)


def _image_value(tag: str, png: bytes):
    from tensorboard.compat.proto.summary_pb2 import Summary

    width, height = _png_size(png)
    return Summary.Value(tag=tag, image=Summary.Image(height=height, width=width, colorspace=4, encoded_image_string=png))


def write_report_events(out: Path, summary: str, scorecard: str, figures: list[str]) -> Path:
    """Write the summary and scorecard (markdown) and the named figures of ``out`` as one event file in ``out``;
    earlier report event files there are removed first. Returns the file written."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    for old in out.glob("events.out.tfevents.*"):
        old.unlink()
    values = [text_value(tags.REPORT_SUMMARY, summary), text_value(tags.REPORT_SCORECARD, scorecard)]
    order = [name for name in KEY_FIGURES if name in figures] + [name for name in figures if name not in KEY_FIGURES]
    for i, name in enumerate(order):  # a numbered tag keeps the key figures first in the Images tab
        values.append(_image_value(tags.report_figure(f"{i:02d}_{Path(name).stem}"), (out / name).read_bytes()))
    writer = EventFileWriter(str(out))
    for value in values:
        writer.add_event(Event(wall_time=time.time(), step=0, summary=Summary(value=[value])))
    writer.close()
    written = sorted(out.glob("events.out.tfevents.*"))
    if len(written) != 1:
        raise RuntimeError(f"expected one report event file in {out}, found {len(written)}")
    return written[0]
