#!/bin/bash
paste -sd+ input.txt | bc > final.txt
