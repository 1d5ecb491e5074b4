"""Targets, the printed table, docs/benchmarks.md's "## Comparison" section and the bar chart."""

from __future__ import annotations

import os
from pathlib import Path

SPDL_RS = "spdl-rs"
SPDL_RS_T1 = "spdl-rs-t1"
SECTION = "## Comparison"

LABELS = {
    "spdl-rs": "spdl-rs (`spdl bench`)",
    "spdl-rs-t1": "spdl-rs (`spdl bench --threads 1`)",
    "spdl-0.8": "Meta SPDL 0.8.0 (pipeline + load_image_batch)",
    "pillow": "Pillow loop, 1 thread",
    "torch-pil-w0": "torch DataLoader, PIL, 0 workers",
    "torch-pil-w2": "torch DataLoader, PIL, 2 workers",
    "torch-tv-w0": "torch DataLoader, decode_jpeg, 0 workers",
    "torch-tv-w2": "torch DataLoader, decode_jpeg, 2 workers",
}
TORCH = ["torch-pil-w0", "torch-pil-w2", "torch-tv-w0", "torch-tv-w2"]
TORCH_W0 = ["torch-pil-w0", "torch-tv-w0"]
TORCH_W2 = ["torch-pil-w2", "torch-tv-w2"]


def _ok(summary: dict, name: str) -> dict | None:
    s = summary.get(name)
    return s if s and s.get("ok") else None


def targets(summary: dict) -> list[dict]:
    """The three targets of issue 3, each judged against the strictest peer that ran."""
    rs = _ok(summary, SPDL_RS)
    out = []

    def add(name: str, required: str, against: str | None, ratio: float | None, met: bool | None):
        out.append({"target": name, "required": required, "against": against, "ratio": ratio, "met": met})

    spdl = _ok(summary, "spdl-0.8")
    if rs and spdl:
        ratio = rs["images_per_cpu_sec"] / spdl["images_per_cpu_sec"]
        add("img/s per CPU core vs Meta SPDL 0.8.0", ">= 2.0x", "spdl-0.8", ratio, ratio >= 2.0)
    else:
        add("img/s per CPU core vs Meta SPDL 0.8.0", ">= 2.0x", None, None, None)

    torch = [(n, _ok(summary, n)) for n in TORCH if _ok(summary, n)]
    if rs and torch:
        best, s = max(torch, key=lambda item: item[1]["images_per_cpu_sec"])
        ratio = rs["images_per_cpu_sec"] / s["images_per_cpu_sec"]
        add("img/s per CPU core vs the most efficient torch DataLoader", ">= 1.5x", best, ratio, ratio >= 1.5)
    else:
        add("img/s per CPU core vs the most efficient torch DataLoader", ">= 1.5x", None, None, None)

    # The same target like for like: one decoding thread against the single-process DataLoaders (0 workers),
    # two against the 2-worker ones. Two threads on two busy cores do less work per CPU-second than one, for
    # every runner (compare torch's w0 and w2 rows), so the judgement above charges spdl-rs for that.
    for mine, peers, what in ((SPDL_RS_T1, TORCH_W0, "1 thread vs 0 workers"),
                              (SPDL_RS, TORCH_W2, "2 threads vs 2 workers")):
        own = _ok(summary, mine)
        ran = [(n, _ok(summary, n)) for n in peers if _ok(summary, n)]
        name = f"img/s per CPU core vs the most efficient torch DataLoader, {what}"
        if own and ran:
            best, s = max(ran, key=lambda item: item[1]["images_per_cpu_sec"])
            ratio = own["images_per_cpu_sec"] / s["images_per_cpu_sec"]
            add(name, ">= 1.5x", best, ratio, ratio >= 1.5)
        elif mine in summary:
            add(name, ">= 1.5x", None, None, None)

    w2 = [(n, _ok(summary, n)) for n in TORCH_W2 if _ok(summary, n)]
    if rs and w2:
        lean, s = min(w2, key=lambda item: item[1]["peak_rss_bytes"])
        ratio = s["peak_rss_bytes"] / rs["peak_rss_bytes"]
        add("peak RSS: torch DataLoader (2 workers) / spdl-rs", ">= 5.0x", lean, ratio, ratio >= 5.0)
    else:
        add("peak RSS: torch DataLoader (2 workers) / spdl-rs", ">= 5.0x", None, None, None)
    return out


def _rows(results: dict) -> list[list[str]]:
    summary = results["summary"]
    rs = _ok(summary, SPDL_RS)
    rows = []
    for name, s in summary.items():
        if not s.get("ok"):
            rows.append([name, "failed", "", "", "", "", "", ""])
            continue
        speed = per_core = rss = ""
        if rs and name not in (SPDL_RS, SPDL_RS_T1):
            speed = f"{rs['images_per_sec'] / s['images_per_sec']:.2f}x"
            per_core = f"{rs['images_per_cpu_sec'] / s['images_per_cpu_sec']:.2f}x"
            rss = f"{s['peak_rss_bytes'] / rs['peak_rss_bytes']:.1f}x"
        rows.append([
            name,
            f"{s['images_per_sec']:.0f} ({s['images_per_sec_min']:.0f}-{s['images_per_sec_max']:.0f})",
            f"{s['cpu_seconds']:.2f}",
            f"{s['images_per_cpu_sec']:.0f}",
            f"{s['peak_rss_bytes'] / 2**20:.0f}",
            speed,
            per_core,
            rss,
        ])
    return rows


HEADER = ["runner", "img/s (min-max)", "CPU s", "img/s per core", "peak RSS MiB",
          "spdl-rs img/s x", "spdl-rs per-core x", "RSS / spdl-rs"]


def _target_lines(results: dict) -> list[str]:
    lines = []
    for t in results["targets"]:
        if t["met"] is None:
            lines.append(f"{t['target']} ({t['required']}): not judged (a runner failed or was not run)")
        else:
            verdict = "met" if t["met"] else "NOT met"
            lines.append(f"{t['target']} ({t['required']}, against {t['against']}): "
                         f"{t['ratio']:.2f}x -> {verdict}")
    return lines


def _py_notes(results: dict) -> list[str]:
    py = results["py_pipeline"]
    return py.get("notes") or [py["status"]]


def text_table(results: dict) -> str:
    rows = [HEADER, *_rows(results)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    job = results["job"]
    head = (f"\ndecode + resize {job['size']}x{job['size']} + batch {job['batch_size']}, {job['files']} files, "
            f"{job['threads']} threads/workers, median of {job['rounds']} rounds")
    return "\n".join([head, "", *lines, "", "targets:", *("  " + t for t in _target_lines(results)),
                      "", f"audio/video: {results['audio_video']}",
                      "python pipeline (py_pipeline.py):",
                      *(f"  {note}" for note in _py_notes(results)),
                      *py_pipeline_table(results["py_pipeline"].get("lines") or []), ""])


def _markdown_section(results: dict, png: Path, docs: Path) -> str:
    m, v, job = results["machine"], results["versions"], results["job"]
    rel_png = os.path.relpath(png, docs.parent)
    table = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for row in _rows(results):
        row = [LABELS.get(row[0], row[0]), *row[1:]]
        table.append("| " + " | ".join(row) + " |")
    load = results["load_average"]
    out = [
        SECTION,
        "",
        "_Written by `cargo xtask compare` (benches/compare/); rerun it rather than editing this section._",
        "",
        f"- Date: {results['date']}; commit {results['commit'] or 'unknown'}",
        f"- Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, {m['os']} "
        f"(load average {load['before'][0]:.2f} before, {load['after'][0]:.2f} after; the machine is shared)",
        f"- Command: `{results['command']}`",
        f"- Versions: Python {v['python']}, spdl {v['spdl']}, torch {v['torch']}, torchvision {v['torchvision']}, "
        f"Pillow {v['pillow']}, numpy {v['numpy']}",
        f"- Job: decode + resize to {job['size']}x{job['size']} + batch {job['batch_size']} over the same "
        f"{job['files']} JPEGs ({job['corpus']}), {job['threads']} threads/workers (Pillow: 1), page cache warm; "
        f"each run a process of its own, runners round-robin, median of {job['rounds']} rounds.",
        "",
        *table,
        "",
        "Ratios: `spdl-rs img/s x` and `spdl-rs per-core x` are how many times more images per second "
        "(per CPU-second) spdl-rs decodes than that runner; `RSS / spdl-rs` is how many times more memory "
        "that runner holds. `spdl-rs-t1` is the same binary with one decoding thread (`--threads 1`), the "
        "like-for-like peer of the single-process runners.",
        "",
        "Targets (issue 3): first judged against the strictest peer whatever its thread count, then like for "
        "like (one decoding thread against 0 workers, two against 2 workers):",
        "",
        *(f"- {line}" for line in _target_lines(results)),
        "",
        f"![img/s, img/s per CPU core and peak RSS per loader]({rel_png})",
        "",
        "How it is measured:",
        "",
        "- img/s: images / loading wall time (spdl-rs: the `seconds` of `spdl bench --json`; Python runners: "
        "from the first `next()` to the last batch, so interpreter start and imports are not counted, "
        "DataLoader worker start is).",
        "- CPU s: spdl-rs: the whole process (os.wait4); Python runners: the process and its reaped workers over "
        "the loading only (getrusage). img/s per core = images / CPU s.",
        "- Peak RSS: the process tree's resident set summed over processes, sampled every 50 ms (psutil), "
        "at least the largest single process's ru_maxrss. Forked DataLoader workers share pages with the "
        "parent copy-on-write; the sum counts them once per process, as `ps` and the OOM killer see them.",
        "- Meta SPDL runs `load_image_batch(batch, width, height, pix_fmt=\"rgb24\")` with its defaults "
        "(FFmpeg bicubic scale) in `PipelineBuilder` with `concurrency=2, num_threads=2`; Pillow and the PIL "
        "DataLoader use bilinear resize; the decode_jpeg DataLoader uses `torchvision.transforms.v2.functional."
        "resize(antialias=True)` on uint8 tensors. Every torch process runs one intra-op thread, as DataLoader "
        "workers do (for 0 workers `torch.set_num_threads(1)`: with the default two, OpenMP spin-waiting triples "
        "its CPU time here). spdl-rs runs `--transform resize --no-gpu`.",
        "",
        f"Audio/video (issue 4): {results['audio_video']}.",
        "",
        "Python pipeline benchmark (`benches/compare/py_pipeline.py`, issue 7):",
        "",
        *(f"- {note}" for note in _py_notes(results)),
    ]
    table = py_pipeline_table(results["py_pipeline"].get("lines") or [])
    if table:
        out += ["", *table, "",
                "`vs spdl`: items/s against Meta's spdl on the same benchmark (issue 7's targets: `trivial` "
                ">= 5x; `images` >= 2x, judged per CPU core, which py_pipeline.py does not measure)."]
    return "\n".join(out) + "\n"


def py_pipeline_table(lines: list[dict]) -> list[str]:
    """py_pipeline.py's JSON lines as a markdown table, with spdl_rs/spdl ratios per benchmark."""
    rows = [line for line in lines if "items_per_s" in line]
    if not rows:
        return [f"- {line}" for line in lines]
    base = {line["bench"]: line["items_per_s"] for line in rows if line.get("impl") == "spdl"}
    table = ["| bench | impl | python | items | items/s | peak RSS MB | vs spdl |", "|---|---|---|---|---|---|---|"]
    for line in rows:
        ratio = ""
        if line.get("impl") != "spdl" and base.get(line["bench"]):
            ratio = f"{line['items_per_s'] / base[line['bench']]:.2f}x"
        table.append(f"| {line['bench']} | {line.get('impl')} | {line.get('python')} | {line.get('items')} | "
                     f"{line['items_per_s']:.0f} | {line.get('peak_rss_mb', '')} | {ratio} |")
    skipped = [f"- {line['bench']} / {line.get('impl')}: {line['skipped']}" for line in lines if "skipped" in line]
    return table + ([""] + skipped if skipped else [])


def write_markdown(results: dict, docs: Path, png: Path) -> None:
    """Replaces only the "## Comparison" section of `docs` (up to the next `## ` heading), keeping the rest."""
    section = _markdown_section(results, png, docs)
    if not docs.exists():
        docs.parent.mkdir(parents=True, exist_ok=True)
        docs.write_text("# Benchmarks\n\n" + section)
        return
    lines = docs.read_text().splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == SECTION), None)
    if start is None:
        text = "".join(lines)
        docs.write_text(text + ("\n" if text and not text.endswith("\n\n") else "") + section)
        return
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    tail = lines[end:]
    docs.write_text("".join(lines[:start]) + section + ("\n" if tail else "") + "".join(tail))


def write_png(results: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = {n: s for n, s in results["summary"].items() if s.get("ok")}
    names = list(summary)
    colors = ["#d9480f" if n.startswith(SPDL_RS) else "#868e96" for n in names]
    panels = [
        ("images / s", [summary[n]["images_per_sec"] for n in names]),
        ("images / CPU-second", [summary[n]["images_per_cpu_sec"] for n in names]),
        ("peak RSS (MiB)", [summary[n]["peak_rss_bytes"] / 2**20 for n in names]),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    for ax, (title, values) in zip(axes, panels, strict=True):
        bars = ax.barh(names, values, color=colors)
        ax.invert_yaxis()
        ax.set_title(title)
        ax.bar_label(bars, fmt="%.0f", padding=3, fontsize=8)
        ax.set_xlim(0, max(values) * 1.18 if values else 1)
        ax.grid(axis="x", alpha=0.3)
    for ax in axes[1:]:
        ax.set_yticklabels([])
    job, m = results["job"], results["machine"]
    fig.suptitle(f"decode + resize {job['size']}x{job['size']} + batch {job['batch_size']}, {job['files']} JPEGs, "
                 f"{job['threads']} threads/workers, median of {job['rounds']} -- {m['cpu']}, {m['cores']} cores, "
                 f"{results['date']}", fontsize=10)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
