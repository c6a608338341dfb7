"""Convert Alibaba's cluster-trace-gpu-v2023 pod list (`openb_pod_list_default.csv`) into the
trace the project ships as `replay/traces/alibaba-gpu-v2023.csv.gz`.

    python scripts/convert_alibaba_gpu_v2023.py openb_pod_list_default.csv \
        replay/traces/alibaba-gpu-v2023.csv.gz

Where the source comes from, its licence and what this conversion keeps and drops are in
replay/traces/SOURCE.md. In short: one row per pod that asked for at least one GPU and was
scheduled (a pod deleted while still pending never ran, so it has no run time); submit time
is the pod's creation time, run time its deletion time minus its scheduled time (at least one
second), GPUs its `num_gpu` (a pod sharing a GPU, `gpu_milli` under 1000, asks one whole GPU:
xirang places whole GPUs), and the QoS class is kept as `qos` for the loader's level mapping
(replay/workload.py `ALIBABA_QOS_LEVELS`). Rows keep the source's order; the output is
byte-for-byte reproducible (gzip without a name or time stamp).
"""

from __future__ import annotations

import csv
import gzip
import io
import sys

SOURCE_COLUMNS = (
    "name",
    "num_gpu",
    "gpu_milli",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
)
OUTPUT_COLUMNS = ("job", "submit_s", "duration_s", "gpus", "qos", "gpu_milli", "pod_phase")


def convert(source_path: str) -> tuple[str, dict]:
    """The converted CSV text and counts of what was kept and dropped."""
    with open(source_path, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in SOURCE_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise SystemExit(f"{source_path}: not the v2023 pod list, missing columns {', '.join(missing)}")
        rows = list(reader)
    counts = {"pods": len(rows), "cpu_only": 0, "never_scheduled": 0, "kept": 0}
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(OUTPUT_COLUMNS)
    for row in rows:
        if int(row["num_gpu"]) <= 0:
            counts["cpu_only"] += 1
            continue
        if not row["scheduled_time"]:
            counts["never_scheduled"] += 1
            continue
        run_s = max(1, int(row["deletion_time"]) - int(row["scheduled_time"]))
        writer.writerow(
            (
                row["name"],
                int(row["creation_time"]),
                run_s,
                int(row["num_gpu"]),
                row["qos"],
                int(row["gpu_milli"]),
                row["pod_phase"],
            )
        )
        counts["kept"] += 1
    return out.getvalue(), counts


def main(argv: list[str]) -> int:
    """Convert argv[1] into the gzip file argv[2]."""
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    text, counts = convert(argv[1])
    with (
        open(argv[2], "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=raw, mtime=0) as gz,
    ):
        gz.write(text.encode("utf-8"))
    print(counts)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
