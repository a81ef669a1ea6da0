# Ran on the device as `DIAG=0 bash .device/s31/callA31.sh`, the script
# ../scripts/callA31.sh as committed now; it got the H200: the bench with DeepGEMM live and
# vLLM top-k from the stored figures, the clock probe, the indexer GPU tests.
