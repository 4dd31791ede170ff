"""Images in prompts (vision-language models such as DeepSeek-VL).

`images`: decoding and checking image bytes, the content hash. `spans`: where each image's
tokens sit in a prompt and the prefix-cache keys that tell two images apart. `encoder`: a
loaded model's vision side (its image processor, image token, tokens per image).
Must not know: Django, requests, sampling.
"""
