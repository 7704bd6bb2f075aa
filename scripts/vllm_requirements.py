"""Print the requirements of the installed vLLM distribution that oppo needs, one per line, for pip -r.

vLLM's wheels also require torchvision, torchaudio and torchcodec (its multimodal inputs). Their builds do not
match the torch oppo pins, and transformers then fails to import ("operator torchvision::nms does not exist");
oppo generates text only, so they are left out. Requirements behind an extra are left out too.
"""

import importlib.metadata
import re
import sys

LEFT_OUT = {"torchvision", "torchaudio", "torchcodec"}


def main(distribution: str) -> None:
    for requirement in importlib.metadata.requires(distribution) or ():
        name = re.split(r"[\s<>=!~;\[(]", requirement, maxsplit=1)[0].lower()
        if name in LEFT_OUT or "extra ==" in requirement:
            continue
        print(requirement)


if __name__ == "__main__":
    main(sys.argv[1])
