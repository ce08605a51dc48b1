#!/usr/bin/env sh
# A deploy machine (robot, test rig, workstation): pull the engines CI built and verified for this
# GPU and TensorRT version, then run them. Read-only credentials; no export, no calibration, no build.
set -eu
export ENGINEKIT_REMOTE="${ENGINEKIT_REMOTE:-s3://your-team-bucket/enginekit}"
export ENGINEKIT_REMOTE_MODE=read          # never writes to the store
# AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), AWS_ENDPOINT_URL for a non-AWS store

enginekit doctor | grep '^store:'         # the store, its mode, and whether it answers
enginekit cache pull recipes/yolo12n.yaml  # every cell's engine that serves this GPU, sha256 checked
enginekit predict yolo12n bus.jpg --random-init --precision fp16 --backend tensorrt --save out/
