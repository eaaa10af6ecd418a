#!/bin/bash
paste -sd+ lines.txt | bc > out.txt
