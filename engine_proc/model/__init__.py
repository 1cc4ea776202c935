"""The model side: loading weights, the Llama-family decoder, runners, compiled decode steps, quantization, the fused ops."""
