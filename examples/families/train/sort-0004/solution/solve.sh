#!/bin/bash
sort data.txt > total.txt
