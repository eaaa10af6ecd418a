#!/bin/bash
tail -n 2 in.txt > out.txt
