#!/bin/bash
paste -sd+ input.txt | bc > summary.txt
