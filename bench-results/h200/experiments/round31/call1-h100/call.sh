# Ran on the device as `bash .device/s30/call31.sh`: the script is
# ../../round30/final-h200-scripts/call31.sh (unchanged).
