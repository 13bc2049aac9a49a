#!/usr/bin/env python3
"""Writes options_header.json: header values and how python-multipart's
parse_options_header reads them (the type, and the parameters, a later
one of a key winning), the reading vLLM's form parser (Starlette on
python-multipart) gives a multipart part's Content-Disposition and a
request's Content-Type. TestOptionsHeader checks the gateway's reading
against it.

Run from the repository root with python-multipart importable, e.g.

    pip install python-multipart
    python3 lb/openai/testdata/options_header.py
"""
import json
import os

from python_multipart.multipart import parse_options_header

HEADERS = [
    'form-data; name="model"',
    'attachment; name="model"',
    'form-data; name="x"; name="model"',
    'form-data; name="model"; junk',
    "form-data; name=\"model\"; filename*=UTF-8''a.wav",
    "form-data; name=\"prompt\"; name*=UTF-8''model",
    'form-data; filename="a;b.wav"; name="model"',
    'form-data; name="a\\"b;c"; x=1',
    'form-data; name="a\\\\"; filename="x"',
    'form-data;name=model ;  FileName = "q" ',
    'multipart/form-data; boundary="X\\=Z"',
    'Multipart/Form-Data; boundary=abc',
    'form-data; name="a"b"; c=";d"',
    'form-data; name=""; name',
    ';;name="x"',
    'form-data; name="x\\\\\\"y"',
]

out = []
for h in HEADERS:
    typ, params = parse_options_header(h)
    out.append({
        "header": h,
        "type": typ.decode("latin-1"),
        "params": {k.decode("latin-1"): v.decode("latin-1") for k, v in params.items()},
    })
path = os.path.join(os.path.dirname(__file__), "options_header.json")
with open(path, "w") as f:
    json.dump(out, f, indent=1, ensure_ascii=False)
    f.write("\n")
