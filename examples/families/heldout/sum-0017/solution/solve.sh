#!/bin/bash
paste -sd+ values.txt | bc > output.txt
