#!/bin/bash
seq 1 5 > seq.txt
