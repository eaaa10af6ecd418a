#!/bin/bash
paste -sd+ values.txt | bc > summary.txt
