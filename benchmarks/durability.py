"""What durability costs: serving throughput with the durable store and without it, and the
store's size after many requests.

    python benchmarks/durability.py                          # built-in model, 8 users, 48 requests, 3 rounds
    python benchmarks/durability.py --requests 24 --rounds 1
    python benchmarks/durability.py --store-only --store-requests 10000

Serving: `python app.py` (as users run it, on a free port) serves closed-loop gradio_client users
calling `/generate`, once with `--outputs DIR` (each request accepted into DIR/studio.db with a
synced commit, its PNG written, synced and indexed in the commit that ends it) and once with
`--no-save` (nothing written anywhere). The difference is everything saving costs, the store
and the PNG files together: an upper bound on the store's own cost. Rounds alternate the order of
the two, and the median round is reported (the machine's noise is larger than the effect).

Store size: StudioStore itself, driven as the server drives it per request (accept; then the
History row and the end of the accepted entry in one commit), N times: the database's size on
disk after a checkpoint, and the time per request's commits.

Writes benchmarks/results/durability.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SYSTEMS = ("durable-store", "no-save")
PROMPT = "a large {color} circle on an orange background, right"
COLORS = ("green", "blue", "red", "yellow")


@contextlib.contextmanager
def studio_process(model: str, outputs: Path | None, threads: int, max_per_session: int):
    """`python app.py` on a free port; yields its URL once it answers."""
    import httpx

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    saving = ["--outputs", str(outputs)] if outputs is not None else ["--no-save"]
    command = [sys.executable, str(ROOT / "app.py"), "--model", model, "--port", str(port),
               "--max-per-session", str(max_per_session), *saving]
    process = subprocess.Popen(command, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS=str(threads)),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 600  # only a hung start: loading on a busy machine is slow
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the studio exited: {process.stderr.read().decode()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "healthz", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("the studio did not answer within 600 s")
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(60)


def serve_round(url: str, users: int, requests: int, seed: int) -> dict:
    """`requests` /generate calls from `users` closed-loop clients (each its own session); the
    wall time from the first call to the last answer."""
    from gradio_client import Client

    clients = [Client(url, verbose=False) for _ in range(users)]
    clients[0].predict("warm-up", "", None, None, None, None, seed, "", api_name="/generate")
    remaining = iter(range(requests))
    lock = threading.Lock()
    failures: list[str] = []

    def user(client) -> None:
        while True:
            with lock:
                index = next(remaining, None)
            if index is None:
                return
            try:
                status, _, image = client.predict(PROMPT.format(color=COLORS[index % len(COLORS)]), "", None, None,
                                                  None, None, seed + index, "", api_name="/generate")
                if status.get("state") != "completed" or image is None:
                    failures.append(str(status)[:200])
            except Exception as error:  # noqa: BLE001 - counted, and the benchmark says so
                failures.append(repr(error)[:200])

    start = time.perf_counter()
    threads = [threading.Thread(target=user, args=(client,)) for client in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    for client in clients:
        client.close()
    return {"wall_s": wall, "requests": requests, "failures": failures,
            "requests_per_minute": (requests - len(failures)) * 60 / wall}


def serving(args: argparse.Namespace) -> dict:
    records: dict[str, list[dict]] = {system: [] for system in SYSTEMS}
    for number in range(args.rounds):
        order = SYSTEMS if number % 2 == 0 else tuple(reversed(SYSTEMS))
        for system in order:
            with tempfile.TemporaryDirectory() as folder:
                outputs = Path(folder) / "outputs" if system == "durable-store" else None
                with studio_process(args.model, outputs, args.threads, args.users) as url:
                    record = serve_round(url, args.users, args.requests, seed=1000 * number)
                if outputs is not None:
                    record["saved_files"] = len(list(outputs.glob("*/*.png")))
                    record["database_bytes"] = sum(p.stat().st_size for p in outputs.glob("studio.db*"))
            record["round"] = number
            records[system].append(record)
            print(f"round {number} {system}: {record['requests_per_minute']:.1f} requests/min "
                  f"({record['wall_s']:.1f} s, {len(record['failures'])} failed)", flush=True)
    medians = {system: statistics.median(r["requests_per_minute"] for r in rows) for system, rows in records.items()}
    return {"records": records, "median_requests_per_minute": medians,
            "durable_vs_no_save": medians["durable-store"] / medians["no-save"]}


def store_size(requests: int) -> dict:
    """The store after `requests` requests, each filed as the server files one."""
    from engine import GenerationParams
    from studio.outputs import infotext, parse_infotext
    from studio.store.store import StudioStore

    with tempfile.TemporaryDirectory() as folder:
        store = StudioStore.open(Path(folder))
        owner = "0123456789abcdef" * 2
        start = time.perf_counter()
        for index in range(requests):
            params = GenerationParams(prompt=PROMPT.format(color=COLORS[index % 4]), seed=index, width=64, height=64,
                                      num_inference_steps=8, guidance_scale=1.0)
            entry = store.accept("image", f"session-{index % 8}", owner, params)
            text = infotext(params, "builtin")
            with store.transaction():
                store.add_history({"owner": owner, "path": f"{folder}/2026-12-03/{index:05d}-{index}.png",
                                   "poster": None, "kind": "image", "created": time.time(), "parameters": text,
                                   "settings": dict(parse_infotext(text), model="builtin"), "has_workflow": False})
                store.finished(entry)
        elapsed = time.perf_counter() - start
        store.close()
        # Fold the write-ahead log into the file, as the next start does.
        import sqlite3
        with sqlite3.connect(Path(folder) / "studio.db") as connection:
            connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        size = (Path(folder) / "studio.db").stat().st_size
    return {"requests": requests, "database_bytes": size, "bytes_per_request": size / requests,
            "ms_per_request": elapsed * 1000 / requests}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="builtin")
    parser.add_argument("--users", type=int, default=8)
    parser.add_argument("--requests", type=int, default=48, help="per round and system")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="OMP_NUM_THREADS of the studio")
    parser.add_argument("--store-requests", type=int, default=10_000)
    parser.add_argument("--store-only", action="store_true", help="only the store's size")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "durability.json")
    args = parser.parse_args(argv)

    result = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count()}, "args": {
        k: str(v) for k, v in vars(args).items()}}
    result["store"] = store_size(args.store_requests)
    if not args.store_only:
        result["serving"] = serving(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))

    store = result["store"]
    print(f"\n| store after {store['requests']} requests | {store['database_bytes'] / 2**20:.1f} MiB "
          f"({store['bytes_per_request']:.0f} bytes each) | {store['ms_per_request']:.2f} ms of commits per request |")
    if "serving" in result:
        serving_result = result["serving"]
        print("\n| system | requests/min (median of rounds) |\n|---|---|")
        for system, value in serving_result["median_requests_per_minute"].items():
            print(f"| {system} | {value:.1f} |")
        print(f"\ndurable store vs no-save: {serving_result['durable_vs_no_save']:.3f}x (target: within 3%)")
    return result


if __name__ == "__main__":
    main()
