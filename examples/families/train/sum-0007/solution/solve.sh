#!/bin/bash
paste -sd+ data.txt | bc > output.txt
