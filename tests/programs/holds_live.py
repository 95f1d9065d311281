"""A program holding an open socket and a lock while it trains. usage: holds_live.py OUT STEPS"""
import socket
import sys
import threading

import torch
from common import finish, progress

server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
guard = threading.Lock()
weights = torch.zeros(4)
for step in range(int(sys.argv[2])):
    with guard:
        weights += 1
    progress(step + 1)
server.close()
finish(weights=weights)
