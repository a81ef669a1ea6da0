# Ran on the device as `bash .device/s31/callA31.sh`: the script is ../scripts/callA31.sh
# as committed in 0edf6f7 (before DIAG and NCU_PREFILL: on a card other than the H200 it ran
# the clock probe, then ncu on both prefill scorers).
