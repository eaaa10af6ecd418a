#!/bin/bash
head -n 3 in.txt > out.txt
