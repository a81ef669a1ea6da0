# Ran on the device as `bash .device/s31/callA31.sh`: the script is ../scripts/callA31.sh
# as committed in 25db4a0 (on a card other than the H200: the clock probe only).
