"""Models Ultralytics builds: the YOLO families (``yolo``: detect and every task) and RT-DETR (``rtdetr``),
siblings on one base (``base``: loading, checkpoints, export-mode heads, metadata); their processors (``runtime``)."""
