#!/usr/bin/env python3
"""Writes a JSON document of about SIZE bytes to OUT: records of ids, names, e-mails, numbers,
tags (real JSON, not one repeated byte), cut at a record boundary so it stays valid. The same
seed each time: benches/compression.sh and benches/callgrind.sh (BODY_BYTES) serve it.

Usage: json_doc.py SIZE OUT"""
import json
import random
import sys

size_wanted, out = int(sys.argv[1]), sys.argv[2]
random.seed(30)
words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()
records, size, i = [], 0, 0
while size < size_wanted:
    r = {
        "id": 100000 + i,
        "name": f"{random.choice(words).title()} {random.choice(words).title()}",
        "email": f"user{i}.{random.choice(words)}@example.{random.choice(['com', 'org', 'net'])}",
        "score": round(random.uniform(0, 1000), 2),
        "active": random.random() < 0.7,
        "tags": random.sample(words, random.randint(1, 4)),
        "created": f"2026-{random.randint(1, 12):02d}-{random.randint(1, 28):02d}T{random.randint(0, 23):02d}:{random.randint(0, 59):02d}:00Z",
    }
    records.append(r)
    size += len(json.dumps(r)) + 1
    i += 1
text = json.dumps({"count": len(records), "items": records})[: size_wanted - 2]
# Cut at a record boundary so it stays valid JSON.
text = text[: text.rfind("},") + 1] + "]}"
json.loads(text)
open(out, "w").write(text)
