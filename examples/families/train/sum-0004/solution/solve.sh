#!/bin/bash
paste -sd+ items.txt | bc > summary.txt
