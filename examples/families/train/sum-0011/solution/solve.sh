#!/bin/bash
paste -sd+ lines.txt | bc > result.txt
