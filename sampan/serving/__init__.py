"""`sampan serve`: saved programs and recommendation models behind the KServe v2 / Triton
open inference protocol (HTTP/REST), with dynamic batching, health, metrics and online
embedding updates (issue 20). The server libraries are imported only when serving."""

EXPORTS: list = []  # names bound on `sampan` itself (none: use sampan.serving.*)
