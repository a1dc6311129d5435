#!/usr/bin/env bash
# Issue 41's bars: tools/bars.sh --set variants (kept under its old name for the runs that cite it).
exec "$(dirname "$0")/bars.sh" "$@" --set variants
