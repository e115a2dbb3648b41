"""The GPU check's results as Markdown: the tables docs/benchmarks.md takes when a GPU run happens."""

from __future__ import annotations

SGLANG_ANCHOR = "SGLang's Qwen-Image: 3.21x at batch 16 on an H200"


def _num(value, digits: int = 2, scale: float = 1.0) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def _sci(value) -> str:
    return "-" if value is None else f"{value:.2g}"


def header(report: dict) -> list[str]:
    machine = report["machine"]
    return [
        f"## GPU check: {machine['device_name']} ({report['settings']['name']}, {report['settings']['dtype']}), "
        f"{machine['date']}",
        "",
        f"torch {machine['torch']}, CUDA {machine['cuda'] or '-'}, diffusers {machine['diffusers']}, "
        f"flash-attn {machine['flash_attn'] or 'not installed'}; {machine['cpus']} CPU cores. "
        f"Wall time {report['wall_s']:.0f} s of a {report['budget_s']:.0f} s budget.",
    ]


def parity_table(section: dict) -> list[str]:
    lines = ["", f"### Correctness: every family's step pipeline against its stock `__call__` ({section['dtype']}, "
                 f"{section['device']})", "", f"Bounds, from the dtype: {section['bounds']}.", "",
             "| family | run | request | attention | max abs diff | bound | uint8 diff | bound | passed |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in section["rows"]:
        if "error" in row and "max_abs_diff" not in row:
            lines.append(f"| {row['family']} | {row['run']} | {row['error']} | | | | | | no |")
            continue
        attention = f"{row['attention_setting']}: {row['attention_kernels']}"
        shared = f" ({row['shared_forwards']} shared forwards)" if "shared_forwards" in row else ""
        lines.append(
            f"| {row['family']} | {row['run']}{shared} | {row['request']} | {attention} | {_sci(row['max_abs_diff'])} "
            f"| {_sci(row['latent_bound'])} | {row['uint8_diff']} | {row['uint8_bound']} "
            f"| {'yes' if row['passed'] else 'NO: ' + row.get('error', 'over the bound')} |")
    return lines


def memory_table(section: dict) -> list[str]:
    allocated = section.get("allocated_by_init_gib")
    parameters = section["parameters"]
    count = f"{parameters / 1e9:.2f}B" if parameters >= 1e9 else f"{parameters / 1e6:.2f}M"
    lines = ["", f"### Memory: {section['model']} ({count} parameters, {section['dtype']})",
             "", f"Weights {section['weights_gib']:.3g} GiB"
                 + (f" ({allocated:.2f} GiB allocated by the init)" if allocated is not None else "")
                 + f", built on the device in {section['init_s']:.1f} s; attention: {section['attention_setting']}, "
                   f"{section['attention_kernels']}. Text: random embeddings (T5 and CLIP shapes), no VAE.", "",
             "| image | batch | image tokens | peak GiB (weights included) | activations GiB | forward ms | finite |",
             "|---|---|---|---|---|---|---|"]
    for row in section["rows"]:
        if "error" in row:
            lines.append(f"| {row['size']}² | {row['batch']} | | {row['error']} | | | |")
            continue
        lines.append(f"| {row['size']}² | {row['batch']} | {row['tokens_per_image']} | {_num(row['peak_gib'])} "
                     f"| {_num(row['activations_gib'])} | {_num(row['forward_s'], 1, 1000)} | {row['finite']} |")
    return lines


def modes_table(modes: dict) -> list[str]:
    rows = modes["rows"]
    base = next((r["images_per_s"] for r in rows if r["system"].startswith("one at a time")), None)
    lines = ["", f"### Serving at {modes['size']}x{modes['size']}: step mode vs request mode vs one at a time", "",
             f"{len(modes['workload'])} requests, open loop, one every two step-times (solo step "
             f"{modes['solo_step_s'] * 1000:.0f} ms), steps {sorted({i['steps'] for i in modes['workload']})}, "
             "one cancelled after its first step; latencies in step-times of each system's own mean step.", "",
             "| system | done | aborted | wall s | images/s | x one at a time | admission p50 (steps) "
             "| cancel, engine (steps) | cancel, client (steps) | mean batch | step ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = r["images_per_s"] / base if base else None
        lines.append(
            f"| {r['system']} | {r['completed']} | {r['aborted']} | {_num(r['wall_s'], 1)} | {_num(r['images_per_s'], 3)} "
            f"| {_num(ratio)} | {_num(r['admission_p50_steps'])} | {_num(r['cancel_engine_steps'])} "
            f"| {_num(r['cancel_client_steps'])} | {_num(r['mean_batch'])} | {_num(r['step_unit_s'], 0, 1000)} |")
    check = modes["stand_in_against_stock"]
    lines += ["", f"The stand-in's step protocol against the stock `FluxPipeline.__call__` on one {check['steps']}-step "
                  f"request: final latents differ by {check['max_abs_diff']:.2g} (bound {check['bound']:.2g}: "
                  f"{'passed' if check['passed'] else 'NOT passed'}); attention {check['attention_kernels']}."]
    target = modes["targets"].get("step_over_request")
    if target:
        lines += ["", f"Step mode / request mode throughput: {target['value']:.2f}x (target {target['target']}: "
                      f"{'met' if target['met'] else 'NOT met'})."]
    return lines


def curve_table(size: int, eager: dict | None, compiled: dict | None) -> list[str]:
    """The eager curve (serving section) beside the compiled one (compile section), either may be missing."""
    eager_rows = {row["batch"]: row for row in (eager or {}).get("rows", [])}
    compiled_rows = {row["batch"]: row for row in (compiled or {}).get("rows", [])}
    lines = ["", f"### Batching curve at {size}x{size} (anchor: {SGLANG_ANCHOR})", "",
             "| batch | images/s | speedup vs batch 1 | step ms | compiled images/s | compiled speedup | compiled / eager |",
             "|---|---|---|---|---|---|---|"]
    for batch in sorted(set(eager_rows) | set(compiled_rows)):
        row, done = eager_rows.get(batch, {}), compiled_rows.get(batch, {})
        gain = done["images_per_s"] / row["images_per_s"] if row and done else None
        lines.append(f"| {batch} | {_num(row.get('images_per_s'), 3)} | {_num(row.get('speedup'))} "
                     f"| {_num(row.get('step_s'), 1, 1000)} | {_num(done.get('images_per_s'), 3)} "
                     f"| {_num(done.get('speedup'))} | {_num(gain)} |")
    if compiled and "first_call_s" in compiled:
        lines += ["", f"`--compile` (torch.compile, dynamic=True): the first call took {compiled['first_call_s']:.0f} s; "
                      "each compiled row's warm-up (recompiles included) is in the JSON."]
    return lines


def caching_table(section: dict) -> list[str]:
    lines = ["", f"### Step caching at {section['size']}x{section['size']}: {section['requests']} requests x "
                 f"{section['steps']} steps side by side", "",
             "| threshold | images/s | x caching off | rows skipped | skipped steps per request | max abs diff from off |",
             "|---|---|---|---|---|---|"]
    for row in section["rows"]:
        speedup = "1.00" if row["speedup"] is None else f"{row['speedup']:.2f}"
        lines.append(f"| {row['threshold']:g} | {row['images_per_s']:.3f} | {speedup} | {row['rows_skipped']:.0%} "
                     f"| {', '.join(map(str, row['skipped_steps']))} | {row['max_abs_diff_from_off']:.2g} |")
    exact = section["nothing_skipped_is_exact"]
    if exact is not None:
        lines += ["", f"Threshold {section['nothing_skipped_threshold']:g} (every row computes through the cache's block loop) gives "
                      f"caching off's latents {'exactly' if exact else 'NOT exactly'}."]
    return lines


def packing_table(section: dict) -> list[str]:
    sizes = ", ".join(f"{s}x{s}" for s in section["sizes"])
    lines = ["", f"### Packed forwards: {section['rows_per_size']} rows each at {sizes} in one forward", "",
             "| system | s/forward | x separate | attention kernel that ran | max rel diff from solo |",
             "|---|---|---|---|---|"]
    for row in section["rows"]:
        lines.append(f"| {row['system']} | {_num(row['seconds'], 3)} | {_num(row['x_separate'])} | {row['kernel']} | "
                     f"{_sci(row['max_rel_diff'])} |")
    if section.get("skipped_varlen"):
        lines.append(f"\nvarlen not measured: {section['skipped_varlen']}.")
    return lines


def _fit(row: dict) -> str:
    if row.get("fits"):
        return "yes"
    return f"no: {row['error']}" if "error" in row else "no"


def plans_table(section: dict) -> list[str]:
    sizes = section["sizes_gib"]
    per_token = section["activation_per_token"] / 1024
    lines = ["", f"### Memory plans on emulated cards: {section['requests']} requests at {section['size']}x{section['size']} "
                 f"({section['dtype']})", "",
             f"{section['model']}: denoiser {sizes['denoiser']:.2f} GiB ({sizes['denoiser_fp8']:.2f} in float8), text "
             f"encoders {sizes['text_encoders']:.2f} GiB ({sizes['text_encoders_fp8']:.2f}), VAE {sizes['vae']:.2f} GiB "
             f"(its bytes only: no decode runs). Activations {per_token:.0f} KiB per token ({section['activation_source']}; "
             f"the loader's estimate before measuring: {section['activation_per_token_estimated'] / 1024:.0f} KiB). "
             f"A card's allocator is capped at its size less {section['context_gib']} GiB; images/s are "
             f"{section['requests']} / (encode + {section['full_steps']} x s/step + decode).", "",
             "| plan | on device after placing GiB (arithmetic) | cap | peak GiB | encode s (text-encoder trips) | s/step "
             "| images/s | vs resident: max abs / rel RMS |", "|---|---|---|---|---|---|---|---|"]
    for plan in section["plans"]:
        run = plan["uncapped"]
        if not run.get("fits"):
            lines.append(f"| {plan['plan']} | | {run['cap']} | {_fit(run)} | | | | |")
            continue
        parity = plan["against_resident"] or {"max_abs_diff": None, "relative_rms": None, "exact": False}
        lines.append(
            f"| {plan['plan']} | {_num(plan['allocated_after_placing_gib'])} ({plan['predicted_on_device_gib']:.2f}) "
            f"| {run['cap']} | {_num(run['peak_gib'])} | {_num(run['encode_s'], 3)} ({run['text_encoder_trips']}) "
            f"| {_num(run['step_s'], 3)} | {_num(run['images_per_s'], 3)} "
            f"| {_sci(parity['max_abs_diff'])} / {_sci(parity['relative_rms'])}{' (exact)' if parity['exact'] else ''} |")
    lowvram = next((plan for plan in section["plans"] if "against_fp8" in plan), None)
    if lowvram:
        same = lowvram["against_fp8"]
        lines += ["", f"lowvram against fp8 (the same float8 weights, streamed block by block): "
                      f"{'exactly equal' if same['exact'] else 'max abs diff ' + _sci(same['max_abs_diff'])}."]
    lines += ["", "| card | --memory auto picks (at load / with measured activations) | plan | arithmetic: fits (peak GiB) "
                  "| measured: fits | peak allocated / reserved GiB | s/step | images/s | agree |",
              "|---|---|---|---|---|---|---|---|---|"]
    cards = [card["card_gib"] for card in section["cards"]]
    plans = [plan["plan"] for plan in section["plans"]]
    shown = set()
    for row in sorted(section["rows"], key=lambda row: (cards.index(row["card_gib"]), plans.index(row["plan"]))):
        card = section["cards"][cards.index(row["card_gib"])]
        auto = "" if card["card_gib"] in shown else f"{card['auto_at_load']} / {card['auto_measured']}"
        shown.add(card["card_gib"])
        measured = _fit(row) if row["measured"] else f"no ({row['error']}: not run)"
        cap = f" ({row['cap']})" if row.get("cap") == "no cap on cpu" else ""
        peaks = f"{_num(row.get('peak_gib'))} / {_num(row.get('reserved_gib'))}"
        lines.append(
            f"| {row['card_gib']} GB{cap} | {auto} | {row['plan']} "
            f"| {'yes' if row['predicted_fits'] else 'no'} ({row['predicted_peak_gib']:.2f}) | {measured} | {peaks} "
            f"| {_num(row.get('step_s'), 3)} | {_num(row.get('images_per_s'), 3)} "
            f"| {'yes' if row['predicted_fits'] == row['fits'] else 'NO'} |")
    return lines


def skipped_list(report: dict) -> list[str]:
    lines = []
    for name, section in report["sections"].items():
        if section["status"] == "failed":
            lines.append(f"- {name}: FAILED: {section['error']}")
        for skipped in section.get("skipped", []):
            lines.append(f"- {name}: {skipped['what']}: {skipped['reason']}")
    return ["", "### Skipped or failed", ""] + (lines or ["- nothing"])


def markdown(report: dict) -> str:
    sections = report["sections"]
    lines = header(report)
    if sections["parity"]["status"] == "ran":
        lines += parity_table(sections["parity"])
    if sections["memory"]["status"] == "ran":
        lines += memory_table(sections["memory"])
    if sections.get("plans", {}).get("status") == "ran":
        lines += plans_table(sections["plans"])
    serving = sections["serving"] if sections["serving"]["status"] == "ran" else None
    compiled = sections["compile"] if sections["compile"]["status"] == "ran" else None
    if serving:
        lines += modes_table(serving["modes"])
    if serving or (compiled and compiled["rows"]):
        lines += curve_table(report["settings"]["curve_size"], serving and serving["curve"], compiled)
    if sections.get("caching", {}).get("status") == "ran":
        lines += caching_table(sections["caching"])
    if sections.get("packing", {}).get("status") == "ran":
        lines += packing_table(sections["packing"])
    lines += skipped_list(report)
    return "\n".join(lines) + "\n"
