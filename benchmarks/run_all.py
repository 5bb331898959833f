"""Every peer comparison on this machine in one run, their tables written into BENCHMARKS.md under its name.

    bash benchmarks/install_peers.sh
    python benchmarks/run_all.py --peers-python .venv-peers/bin/python [--nanogpt PATH]

Runs each comparison script with `--json`, every engine in its own process (torch and TensorFlow never
share one):

- decoding: `generate_vs_transformers.py`, GPT-2 small greedy decoding at batch 1 and 8 against
  transformers, ONNX Runtime and llama.cpp, at each weight precision;
- training: `nanogpt_cpu.py`, nanoGPT's CPU recipe, when `--nanogpt` names a nanoGPT checkout.

Then writes their tables into BENCHMARKS.md under the heading `SECTION`, as a block headed by this
machine's CPU model, core count and kernel flags (`timing.cpu()`), with the date, the commit and the
command of each table. A later run on a machine of the same kind replaces the tables it ran in that block (a
run `--only` one comparison keeps the other's) and leaves the other machines' blocks alone, so no ratio ever
mixes two machines. `--from DIR` writes the tables from an earlier run's
JSON files (`decoding.json`, `training.json`) without running anything; the date and commit are those
this script stored in them, else the files' date and "commit not recorded".
"""

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SECTION = "## CPU: decoding and training against the peers (`benchmarks/run_all.py`)"
INTRO = (
    "Written by `benchmarks/run_all.py`: one block per kind of CPU, each table from one run on that machine; "
    "compare ratios within a table only."
)
# A peer's weight format -> our engine at the same bytes per weight.
SAME_WIDTH = {
    "float32": "float32",
    "f32": "float32",
    "bfloat16": "bfloat16",
    "f16": "bfloat16",
    "int8": "int8",
    "q8_0": "int8",
}


def checkout_commit():
    """The checkout's short commit, marked when the code it measures has uncommitted changes; None without git."""
    root = os.path.dirname(HERE)
    try:
        git = ("git", "-C", root)
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        changed = subprocess.run(
            [*git, "status", "--porcelain", "--", "keras_tfam", "pipelines", "benchmarks"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + (" with uncommitted changes" if changed.stdout.strip() else "")


def run_script(script, json_path, *arguments):
    """`python benchmarks/script *arguments --json json_path`, its output passed through; the JSON it wrote,
    with the date and commit added (and written back, for a later `--from`)."""
    command = [sys.executable, os.path.join(HERE, script), *map(str, arguments), "--json", json_path]
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True)
    with open(json_path) as f:
        result_file = json.load(f)
    result_file.update(date=datetime.date.today().isoformat(), commit=checkout_commit())
    with open(json_path, "w") as f:
        json.dump(result_file, f)
    return result_file


def ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "-"


def decoding_table(result_file):
    """Markdown: each engine's tokens/s at each batch, against ours at the same weight width and in float32."""
    results, batches = result_file["results"], [str(b) for b in result_file["settings"]["batch"]]
    reference = results.get("transformers-float32")
    speeds = {engine: result["tokens_per_s"] for engine, result in results.items()}
    header = [
        "engine",
        *(f"tok/s, batch {b}" for b in batches),
        *(f"ours same width / it, batch {b}" for b in batches),
        *(f"ours f32 / it, batch {b}" for b in batches),
        *(f"tokens = transformers f32, batch {b}" for b in batches),
    ]
    lines = ["| " + " | ".join(header) + " |", "|---" + "|---:" * (len(header) - 1) + "|"]
    for engine, result in results.items():
        ours = speeds.get(f"keras_tfam-{SAME_WIDTH.get(engine.split('-', 1)[1], 'float32')}", {})
        same = []
        for b in batches:
            if reference is None:
                same.append("-")
                continue
            pairs = [(x, y) for r, s in zip(result["tokens"][b], reference["tokens"][b]) for x, y in zip(r, s)]
            same.append(f"{100 * sum(x == y for x, y in pairs) / len(pairs):.1f}%")
        lines.append(
            "| "
            + " | ".join(
                [
                    engine,
                    *(f"{speeds[engine][b]:.1f}" for b in batches),
                    *(ratio(ours.get(b), speeds[engine][b]) for b in batches),
                    *(ratio(speeds.get("keras_tfam-float32", {}).get(b), speeds[engine][b]) for b in batches),
                    *same,
                ]
            )
            + " |"
        )
    versions = "; ".join(dict.fromkeys(result["version"] for result in results.values()))
    settings = result_file["settings"]
    return (
        f"GPT-2 small, random weights, prompt {settings['prompt']}, {settings['new']} new tokens, greedy, "
        f"median of {settings['repeats']}; {versions}.\n\n" + "\n".join(lines)
    )


def training_table(result_file):
    """Markdown: nanoGPT's CPU recipe, tokens/s and validation loss of each engine."""
    results = result_file["results"]
    ours = results["keras_tfam"]["tokens_per_s"]
    lines = ["| engine | tokens/s | keras_tfam / it | validation loss | kernel path |", "|---|---:|---:|---:|---|"]
    for name, result in results.items():
        lines.append(
            f"| {name} | {result['tokens_per_s']:,.0f} | {ratio(ours, result['tokens_per_s'])} | "
            f"{result['val_loss']:.4f} | {result.get('kernel_path', '-').removeprefix('kernel path: ')} |"
        )
    text = os.path.basename(result_file["settings"]["text"])
    return f"nanoGPT's CPU recipe on {text}, {result_file['settings']['iters']} iterations.\n\n" + "\n".join(lines)


# Each comparison: the script that measures it, its heading in a machine's block, its table.
COMPARISONS = {
    "decoding": ("generate_vs_transformers.py", "#### Greedy decoding (`generate_vs_transformers.py`)", decoding_table),
    "training": ("nanogpt_cpu.py", "#### Training, nanoGPT's CPU recipe (`nanogpt_cpu.py`)", training_table),
}


def block_pattern(machine):
    return re.compile(rf"<!-- machine: {re.escape(machine)} -->.*?<!-- /machine -->", re.S)


def comparison_part(name, result_file, command):
    """One comparison's part of a machine block: its heading, when, at which commit and how, its table."""
    _, heading, table = COMPARISONS[name]
    commit = result_file.get("commit") or "not recorded"
    return f"{heading}\n\n{result_file['date']}, commit {commit}, `{command}`. {table(result_file)}"


def earlier_parts(path, machine):
    """The parts of this machine's block already in BENCHMARKS.md, {comparison: part}: a run of one comparison
    (`--only`) keeps the others'."""
    with open(path) as f:
        match = block_pattern(machine).search(f.read())
    parts = {}
    for piece in re.split(r"\n(?=#### )", match.group(0).removesuffix("<!-- /machine -->")) if match else []:
        for name, (_, heading, _) in COMPARISONS.items():
            if piece.startswith(heading):
                parts[name] = piece.strip()
    return parts


def machine_block(machine, parts):
    """The BENCHMARKS.md block of one machine: its name, then a part per comparison."""
    body = "\n\n".join(parts[name] for name in COMPARISONS if name in parts)
    return f"<!-- machine: {machine} -->\n### {machine}\n\n{body}\n<!-- /machine -->"


def write_block(path, machine, block):
    """Puts `block` into BENCHMARKS.md: in place of this machine's block, else at the end of the section."""
    with open(path) as f:
        text = f.read()
    existing = block_pattern(machine)
    if existing.search(text):
        text = existing.sub(lambda _: block, text)
    elif SECTION in text:
        start = text.index(SECTION) + len(SECTION)
        following = re.search(r"^## ", text[start:], re.M)
        end = start + following.start() if following else len(text)
        text = text[:end].rstrip("\n") + "\n\n" + block + "\n" + ("\n" + text[end:] if following else "")
    else:
        text = text.rstrip("\n") + f"\n\n{SECTION}\n\n{INTRO}\n\n{block}\n"
    with open(path, "w") as f:
        f.write(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers-python", help="the Python of the peers (benchmarks/install_peers.sh)")
    parser.add_argument("--nanogpt", help="a checkout of karpathy/nanoGPT (without it: no training table)")
    parser.add_argument(
        "--only", nargs="+", choices=tuple(COMPARISONS), default=tuple(COMPARISONS), help="run only these comparisons"
    )
    parser.add_argument("--out", default=None, help="folder for the JSON results (default: a new temporary one)")
    parser.add_argument("--from", dest="source", help="write the tables from this folder's JSON files, run nothing")
    parser.add_argument(
        "--benchmarks-md",
        default=os.path.normpath(os.path.join(HERE, "..", "BENCHMARKS.md")),
        help="the file to write (default: %(default)s)",
    )
    sys.path.insert(0, HERE)
    from timing import add_smoke, cpu, smoke_folder

    add_smoke(parser)  # each comparison's own --smoke, nanoGPT's recipe without nanoGPT; the tables printed only
    args = parser.parse_args()
    folder = args.source or (smoke_folder("run_all") if args.smoke else args.out or tempfile.mkdtemp(prefix="run_all-"))
    if not args.source:
        os.makedirs(folder, exist_ok=True)
    runs = {}
    if args.source:
        for name in COMPARISONS:
            path = os.path.join(folder, f"{name}.json")
            if os.path.isfile(path):
                with open(path) as f:
                    runs[name] = json.load(f)
                modified = datetime.date.fromtimestamp(os.path.getmtime(path)).isoformat()
                runs[name].setdefault("date", modified)
        if not runs:
            parser.error(f"--from: no decoding.json or training.json in {folder!r}")
    else:
        peers = ["--peers-python", args.peers_python] if args.peers_python else []
        peers = ["--smoke"] if args.smoke else peers  # the peers do not run under --smoke
        if "decoding" in args.only:
            runs["decoding"] = run_script(COMPARISONS["decoding"][0], os.path.join(folder, "decoding.json"), *peers)
        if "training" in args.only and args.smoke:  # our side of nanoGPT's recipe, without a checkout
            runs["training"] = run_script(COMPARISONS["training"][0], os.path.join(folder, "training.json"), *peers)
        elif "training" in args.only and args.nanogpt:
            runs["training"] = run_script(
                COMPARISONS["training"][0], os.path.join(folder, "training.json"), "--nanogpt", args.nanogpt, *peers
            )
        elif "training" in args.only:
            print("training: skipped (no --nanogpt checkout)", flush=True)
        if not runs:
            parser.error("nothing to run: --only training needs --nanogpt")
    machines = {result_file["machine"] for result_file in runs.values()}
    if len(machines) != 1 or cpu() not in machines and not args.source:
        raise SystemExit(f"the runs come from different machines ({sorted(machines)}): not written together")
    machine = machines.pop()
    command = "python benchmarks/run_all.py --peers-python .venv-peers/bin/python"
    command += " --nanogpt NANOGPT" if "training" in runs else ""
    command += f" --only {' '.join(runs)}" if len(runs) < len(COMPARISONS) else ""
    command += " --smoke" if args.smoke else ""
    parts = {} if args.smoke else earlier_parts(args.benchmarks_md, machine)
    for name, result_file in runs.items():
        if args.source:  # say how the table was made: the script run on its own, then written from its JSON
            command = f"benchmarks/{COMPARISONS[name][0]} --json`, written by `python benchmarks/run_all.py --from DIR"
        parts[name] = comparison_part(name, result_file, command)
    if args.smoke:
        print(f"\n{machine_block(machine, parts)}\n\n--smoke: {os.path.relpath(args.benchmarks_md)} not written")
        return
    write_block(args.benchmarks_md, machine, machine_block(machine, parts))
    print(f"\n{machine}: {', '.join(runs)} written into {os.path.relpath(args.benchmarks_md)} (JSON in {folder})")


if __name__ == "__main__":
    main()
