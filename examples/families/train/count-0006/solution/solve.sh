#!/bin/bash
wc -l < input.txt > out.txt
