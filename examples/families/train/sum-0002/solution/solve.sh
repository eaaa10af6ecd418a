#!/bin/bash
paste -sd+ lines.txt | bc > final.txt
